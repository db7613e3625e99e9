"""An S3-compatible server on loopback for the object-storage tier (tests/s3/): moto's S3, run
as ``python -m devtools.s3_server --port N`` in a process group of its own, so that it can be
stopped (or killed) like the other servers of devtools and a fault-injecting proxy can stand in
front of it (devtools/s3_faults.py).

moto answers ``PutObject`` with ``If-None-Match: *`` by 412 Precondition Failed when the key
exists, which is the put-if-absent a Delta commit relies on (obstore sends it for
``mode="create"`` with no extra option). moto checks and stores in two steps without a lock,
though (``moto/s3/responses.py``: ``get_object`` then ``put_object``), so two such puts of one
key racing in its threaded server could both succeed, which real S3 never lets happen. The
server here therefore serialises conditional puts (``If-None-Match`` / ``If-Match``) with one
lock; every other request runs concurrently as in moto's own server.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import STDOUT, Popen
from sys import executable
from tempfile import TemporaryDirectory
from typing import Any

from devtools.kafka_server import free_port
from devtools.processes import log_tail, stop_group

ACCESS_KEY = "moto-access-key"
SECRET_KEY = "moto-secret-key"
REGION = "us-east-1"
_START_TIMEOUT_S = 60.0

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class S3ServerError(RuntimeError):
    """Raised when the S3 server does not come up or refuses a bucket."""


class ConditionalPutsSerialised:
    """WSGI middleware: conditional PUTs one at a time, so moto's check-then-store is atomic."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        conditional = environ.get("REQUEST_METHOD") == "PUT" and (
            "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ)
        if not conditional:
            return self._app(environ, start_response)
        with self._lock:
            # The whole answer is produced under the lock: moto stores the object while it builds it.
            return list(self._app(environ, start_response))


def serve(port: int) -> None:
    """Serve moto's S3 on 127.0.0.1:``port`` until killed."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = ConditionalPutsSerialised(DomainDispatcherApplication(create_backend_app))
    make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()


@dataclass
class MotoS3:
    """moto's S3 server in a subprocess on a free loopback port; any credentials are accepted,
    ``ACCESS_KEY``/``SECRET_KEY`` are the ones the tier uses."""

    port: int = field(default_factory=free_port)
    _process: Popen[bytes] | None = None
    _temp: TemporaryDirectory[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _log(self) -> Path:
        return Path(self._temp.name if self._temp else "/nonexistent") / "moto.log"

    def start(self) -> MotoS3:
        self._temp = TemporaryDirectory(prefix="moto-s3-")
        with self._log.open("wb") as log:
            self._process = Popen([executable, "-m", "devtools.s3_server", "--port", str(self.port)],
                                  stdout=log, stderr=STDOUT, start_new_session=True,
                                  cwd=Path(__file__).resolve().parent.parent)
        self._wait_until_ready()
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise S3ServerError(f"moto's S3 server exited with {self._process.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2).close()
                return
            time.sleep(0.1)  # polling a starting process, not synchronising a test
        raise S3ServerError(f"moto's S3 server did not answer within {_START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` (path-style ``PUT /bucket``) and return its name."""
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            raise S3ServerError(f"moto refused the bucket {bucket!r}: {exc.code} {exc.read()[:500]!r}") from exc
        return bucket

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self._log, lines)

    def stop(self) -> None:
        stop_group(self._process)
        self._process = None
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def s3a_conf(bucket: str, endpoint: str) -> dict[str, str]:
    """Spark settings pointing Hadoop's S3A connector at ``endpoint`` for ``bucket`` alone (the
    per-bucket form ``fs.s3a.bucket.<bucket>.*``, which our storage options map as well): plain
    http, path-style requests, static credentials, upload blocks buffered in memory.

    Why the buffer: S3A buffers uploads in local temp files by default, found through
    ``FileSystem.getLocal``, which it casts to ``LocalFileSystem``; ``local_session`` sets
    ``fs.file.impl`` to ``RawLocalFileSystem`` (no .crc files), and every S3A write then fails
    with a ClassCastException. ``bytebuffer`` (off-heap blocks) needs no local file system."""
    per_bucket = {
        "fast.upload.buffer": "bytebuffer",
        "endpoint": endpoint, "endpoint.region": REGION, "path.style.access": "true",
        "connection.ssl.enabled": "false", "access.key": ACCESS_KEY, "secret.key": SECRET_KEY,
        "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }
    return {f"spark.hadoop.fs.s3a.bucket.{bucket}.{key}": value for key, value in per_bucket.items()}


def storage_options(endpoint: str) -> dict[str, str]:
    """delta-rs / obstore options for reading the server's tables without Spark."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)


if __name__ == "__main__":
    main()
