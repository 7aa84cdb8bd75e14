"""A TCP proxy on 127.0.0.1 in front of a test server, to cut the network without losing the server.

Stopping a storage server loses its objects (moto and fake-gcs-server keep them in memory); a
proxy that is cut and restored models an outage of the network instead: the bucket's content
survives, so a test can check that what was staged during the outage arrives afterwards.

    with TcpProxy(server.port) as proxy:          # clients use proxy.endpoint
        proxy.cut()                               # connect: refused; open connections: reset
        proxy.restore()                           # listens again on the same port

Threads: one accepting, two per connection (one per direction). Each ends by itself when its
socket is closed, by the peer or by ``cut()``, which waits for them (bounded by ``JOIN_TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from pathlib import Path

from tests.helpers.servers import HOST, free_port

JOIN_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 256  # more open at once is a leak in the code under test: refuse them
_CHUNK = 1 << 16


def stable_port() -> int:
    """A free port outside the kernel's ephemeral range, so that while the proxy is cut no
    client's outgoing connection can take the port and block ``restore()``."""
    try:
        low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return free_port()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    return free_port()


def s3_env_through(proxy: TcpProxy, server_env: dict[str, str]) -> dict[str, str]:
    """``server_env`` (an ``S3Server.env()``) with the endpoints pointing at ``proxy`` instead."""
    return server_env | {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ENDPOINT_URL_S3": proxy.endpoint}


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a network failure does, rather than an orderly FIN.
    SHUT_RD (it sends nothing) wakes a thread blocked in recv() on the socket first."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port``; ``cut()`` / ``restore()`` an outage."""

    def __init__(self, target_port: int, target_host: str = HOST, port: int | None = None):
        self.target = (target_host, target_port)
        self.port = port or stable_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._pairs: set[_Pair] = set()
        self._threads: set[threading.Thread] = set()

    def start(self) -> TcpProxy:
        """Listen on ``self.port`` (the same port after a cut)."""
        with self._lock:
            if self._listener is not None:
                return self
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our reset sockets' TIME_WAIT
            listener.bind((HOST, self.port))
            listener.listen(64)
            self._listener = listener
            self._spawn(self._accept, listener, name=f"proxy-accept-{self.port}")
        return self

    restore = start

    def cut(self) -> None:
        """Stop listening (new connections are refused) and reset every open connection; returns
        once every thread of the proxy has ended."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, set()
            threads = set(self._threads)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
            listener.close()
        for pair in pairs:
            pair.reset()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                raise RuntimeError(f"proxy thread {thread.name} did not end within {JOIN_TIMEOUT_S:.0f}s of cut()")

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cut()

    # -- threads
    def _spawn(self, target, *args, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.add(thread)  # under self._lock (callers hold it)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut(): the listener was shut down
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)  # the server itself is down: the client sees a reset
                continue
            with self._lock:
                if self._listener is not listener or len(self._pairs) >= MAX_CONNECTIONS:
                    _reset(client)
                    _reset(upstream)
                    continue
                pair = _Pair(client, upstream, self._forget)
                self._pairs.add(pair)
                self._spawn(pair.pump, client, upstream, name=f"proxy-up-{self.port}")
                self._spawn(pair.pump, upstream, client, name=f"proxy-down-{self.port}")

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)


class _Pair:
    """The two directions of one proxied connection; the sockets close when both directions end."""

    def __init__(self, client: socket.socket, upstream: socket.socket, forget):
        self.socks = (client, upstream)
        self.forget = forget
        self.open_directions = 2
        self.broken = False  # reset by cut() or a failed side: pass no orderly close on
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.broken = True  # before the resets wake the pumps, so neither sends a FIN to its peer
        for sock in self.socks:  # the client first: it sees the RST, not the server's side closing
            _reset(sock)

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
            if not self.broken:
                dst.shutdown(socket.SHUT_WR)  # pass the half-close on (end of a request or response)
        except OSError:
            self.reset()  # one side failed: the whole connection fails, as on a network
        finally:
            with self.lock:
                self.open_directions -= 1
                last = self.open_directions == 0
            if last:
                self.forget(self)
                for sock in self.socks:
                    with contextlib.suppress(OSError):
                        sock.close()
