"""Loopback HTTP servers for ``voxrelay doctor`` tests, each in a thread on 127.0.0.1:

* :class:`MetadataServer` answers as a cloud's metadata server does: GCE (``GET /instance/zone`` with
  ``Metadata-Flavor: Google``, answered with that header) and/or AWS IMDSv2 (``PUT /api/token``, then
  ``GET /meta-data/placement/region`` with the token). Point ``checkpoint.metadata_url`` at ``.url``.
* :class:`RecordedGCS` answers ``GET /storage/v1/b/<bucket>`` with a recorded bucket resource (the JSON API's),
  for the settings fake-gcs-server does not model (soft delete, multi-region, lifecycle, storage class).
  Point ``STORAGE_EMULATOR_HOST`` at ``.url``.

    with MetadataServer(gce_zone="us-central1-a") as md:
        cfg = load_config(None, [f"checkpoint.metadata_url={md.url}"])
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers.servers import HOST

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
TOKEN = "AQAEAFakeImdsV2Token=="


class _LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) serving ``handler`` until the block ends."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.handler = handler
        self.requests: list[tuple[str, str]] = []  # (method, path) in the order they came
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://{HOST}:{self._httpd.server_address[1]}"

    def __enter__(self):
        self._httpd = ThreadingHTTPServer((HOST, 0), self.handler)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="loopback-http")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet: pytest shows failures, not access logs
        pass

    @property
    def owner(self):
        return self.server.owner  # type: ignore[attr-defined]

    def reply(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for key, value in {"Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)


class _MetadataHandler(_Handler):
    def do_GET(self) -> None:
        md: MetadataServer = self.owner
        md.requests.append(("GET", self.path))
        if self.path == "/instance/zone" and md.gce_zone:
            if self.headers.get("Metadata-Flavor") != "Google":  # as GCE: the header is required
                return self.reply(403, "Missing Metadata-Flavor:Google header.")
            flavor = {"Metadata-Flavor": "Google"} if md.gce_header else {}
            return self.reply(200, f"projects/482913306517/zones/{md.gce_zone}", flavor)
        if self.path == "/meta-data/placement/region" and md.aws_region:
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:  # IMDSv2 required, as on new instances
                return self.reply(401, "")
            return self.reply(200, md.aws_region)
        self.reply(404, "Not Found")

    def do_PUT(self) -> None:
        md: MetadataServer = self.owner
        md.requests.append(("PUT", self.path))
        if self.path == "/api/token" and md.aws_region and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.reply(200, TOKEN)
        self.reply(404, "Not Found")


class MetadataServer(_LoopbackServer):
    """A GCE (``gce_zone``) and/or AWS (``aws_region``) metadata server; neither: one that knows nothing.
    ``gce_header=False``: it answers the zone without ``Metadata-Flavor: Google`` (not really GCE: a proxy, a
    captive portal)."""

    def __init__(self, gce_zone: str | None = None, aws_region: str | None = None, gce_header: bool = True):
        super().__init__(_MetadataHandler)
        self.gce_zone = gce_zone
        self.aws_region = aws_region
        self.gce_header = gce_header


class _GCSHandler(_Handler):
    def do_GET(self) -> None:
        gcs: RecordedGCS = self.owner
        gcs.requests.append(("GET", self.path))
        name = self.path.split("?", 1)[0].removeprefix("/storage/v1/b/")
        if name in gcs.buckets:
            return self.reply(200, json.dumps(gcs.buckets[name]), {"Content-Type": "application/json"})
        error = {"error": {"code": 404, "message": "The specified bucket does not exist.",
                           "errors": [{"message": "The specified bucket does not exist.", "domain": "global",
                                       "reason": "notFound"}]}}
        self.reply(404, json.dumps(error), {"Content-Type": "application/json"})


class RecordedGCS(_LoopbackServer):
    """The GCS JSON API's bucket GET, answered from recorded responses (``tests/fixtures/doctor/<name>.json``)."""

    def __init__(self, *fixtures: str):
        super().__init__(_GCSHandler)
        self.fixtures = fixtures
        self.buckets: dict[str, dict] = {}  # bucket name -> its resource, read when the server starts

    def __enter__(self):
        for name in self.fixtures:
            resource = json.loads((FIXTURES / f"{name}.json").read_text())
            self.buckets[resource["name"]] = resource
        return super().__enter__()
