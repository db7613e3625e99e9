"""A fault-injecting HTTP proxy in front of an S3 server (devtools/s3_server.py), for the
object-storage tier: every request is forwarded as it came, except those an armed fault
matches, which instead

- ``status``: get an S3 error answer without reaching the server (500 InternalError, 503 SlowDown);
- ``delay``: reach the server ``seconds`` late;
- ``drop_after_forward``: reach the server (the put lands), after which the connection is
  closed without an answer: the client sees a reset or an incomplete message, and cannot tell
  whether its request took effect.

It runs in threads of the process that arms it (a test), so faults are armed and their hits
read without any protocol; clients in other processes reach it by its endpoint.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal["status", "delay", "drop_after_forward"]
_ERROR_CODES = {500: "InternalError", 503: "SlowDown"}
# Hop-by-hop headers and the ones this proxy sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                            "upgrade", "expect", "content-length"})


@dataclass
class Fault:
    """What to do to the next ``times`` requests of ``method`` whose path matches ``path``."""

    kind: FaultKind
    method: str
    path: str  # a regular expression searched in the request path
    times: int = 1
    status: int = 503
    seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and re.search(self.path, path) is not None


@dataclass(frozen=True)
class Hit:
    """A request a fault acted on."""

    kind: FaultKind
    method: str
    path: str
    upstream_status: int | None  # the server's answer the client never saw (drop_after_forward)


@dataclass
class _Faults:
    armed: list[Fault] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.armed:
                if fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    def record(self, hit: Hit) -> None:
        with self.lock:
            self.hits.append(hit)


class FaultProxy:
    """The proxy on a free loopback port, forwarding to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._faults = _Faults()
        handler = _handler_for(parts.hostname or "127.0.0.1", parts.port or 80, self._faults)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def arm(self, fault: Fault) -> Fault:
        with self._faults.lock:
            self._faults.armed.append(fault)
        return fault

    def reset(self) -> None:
        """No fault armed, no hit recorded."""
        with self._faults.lock:
            self._faults.armed.clear()
            self._faults.hits.clear()

    def hits(self) -> list[Hit]:
        with self._faults.lock:
            return list(self._faults.hits)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(host: str, port: int, faults: _Faults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered as the SDKs want

        def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read the hits
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            upstream = http.client.HTTPConnection(host, port, timeout=120)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                return response.status, response.reason, response.getheaders(), data
            finally:
                upstream.close()

        def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status, reason)
            for name, value in headers:
                if name.lower() not in _NOT_FORWARDED:
                    self.send_header(name, value)
            # A HEAD answer has no body but tells the object's size: the server's Content-Length.
            length = dict((k.lower(), v) for k, v in headers).get("content-length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _handle(self) -> None:
            body = self._body()
            fault = faults.take(self.command, self.path)
            if fault is None:
                self._answer(*self._forward(body))
                return
            if fault.kind == "status":
                faults.record(Hit(fault.kind, self.command, self.path, None))
                code = _ERROR_CODES.get(fault.status, "InternalError")
                xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                       f"<Message>injected by devtools/s3_faults.py</Message></Error>").encode()
                self._answer(fault.status, code, [("Content-Type", "application/xml")], xml)
                return
            if fault.kind == "delay":
                time.sleep(fault.seconds)  # the injected fault itself: a slow server
                faults.record(Hit(fault.kind, self.command, self.path, None))
                self._answer(*self._forward(body))
                return
            status, _, _, _ = self._forward(body)
            faults.record(Hit(fault.kind, self.command, self.path, status))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # the put landed; its answer never leaves

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler
