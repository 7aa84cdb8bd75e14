"""An HTTP proxy on 127.0.0.1 in front of a storage test server that can start refusing writes with
HTTP 403, as a bucket does when billing is disabled, access is revoked or a retention lock holds: reads
still pass, every PUT/POST/PATCH/DELETE gets 403 with the error body the real service sends, so each
SDK raises whatever exception class it raises for it (gcsfs: a plain OSError("Forbidden"); s3fs:
PermissionError).

    with WriteGate(server.port, kind="gcs") as gate:   # clients use gate.endpoint
        gate.refuse()                                   # from now on: 403 on writes
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading

from tests.helpers.servers import HOST

_BODIES = {
    "gcs": ("application/json", json.dumps({"error": {"code": 403, "message": "The billing account for the owning "
                                                      "project is disabled in state absent", "errors": []}})),
    "s3": ("application/xml", "<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
                              "<Message>Access Denied</Message></Error>"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


class WriteGate:
    def __init__(self, target_port: int, kind: str):
        self.target_port = target_port
        self.kind = kind
        self.refusing = threading.Event()
        self.refused = 0  # writes answered with 403
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    def refuse(self) -> None:
        self.refusing.set()

    def __enter__(self) -> WriteGate:
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if gate.refusing.is_set() and self.command in ("PUT", "POST", "PATCH", "DELETE"):
                    gate.refused += 1
                    kind, text = _BODIES[gate.kind]
                    return self._reply(403, {"Content-Type": kind}, text.encode())
                conn = http.client.HTTPConnection(HOST, gate.target_port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self._reply(resp.status, {k: v for k, v in resp.getheaders() if k.lower() not in _HOP
                                              and k.lower() != "content-length"}, data)
                finally:
                    conn.close()

            def _reply(self, status: int, headers: dict, data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = do_HEAD = _forward  # noqa: N815

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="write-gate").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
