"""What both Kafka clients share: the client kinds, the constants, :class:`KafkaSourceError`,
the choice and import of the client module, the translation of ``kafka.*`` options,
:class:`ClientSpec` and :class:`ReadRequest`. Imports neither client at module level."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streaming_merge.errors import StreamingMergeError

log = logging.getLogger("streaming_merge.kafka.source")

CONFLUENT = "confluent"
KAFKA_PYTHON = "kafka-python"
CLIENT_KINDS = (CONFLUENT, KAFKA_PYTHON)

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])

# Reading: records asked of the client per call, rows per Arrow batch handed to Spark, and how
# long one client call may block before the loop re-checks its deadline.
_FETCH_RECORDS = 10_000
_BATCH_ROWS = 20_000
_WAIT_SLICE_S = 0.5
_METADATA_TIMEOUT_S = 30.0
# How long the broker may hold a cached consumer's fetch when there is nothing new (librdkafka's
# fetch.wait.max.ms, default 500 ms). An idle cached consumer at the end of its partition always
# has such a fetch outstanding, and a read that must seek first (Spark gives a partition's
# next range to whichever Python worker is free, so about half the reads of a 2-worker
# executor find their consumer elsewhere) waits for it to come back: 100-360 ms per read at
# 500 ms, 10-25 ms at 50 ms. The price is one empty fetch per idle cached consumer every
# 50 ms. kafka-python fetches only while polled, so it keeps its default.
# ``kafka.fetch.max.wait.ms`` overrides it.
EXECUTOR_FETCH_WAIT_MS = 50

# The consumer cache, as Spark's own (spark.kafka.consumer.cache.capacity / .timeout).
CACHE_CAPACITY = 64
CACHE_IDLE_TIMEOUT_S = 300.0
STATS_DIR_ENV = "STREAMING_MERGE_KAFKA_CONSUMER_STATS_DIR"


class KafkaSourceError(StreamingMergeError):
    """Raised when the Kafka source cannot continue: bad options, an unreachable broker,
    or (with failOnDataLoss) offsets that are no longer available."""


# ----------------------------------------------------------------------------- client choice


def client_importable(kind: str) -> bool:
    """Whether the module of ``kind`` imports in this interpreter."""
    try:
        if kind == CONFLUENT:
            import confluent_kafka  # noqa: F401
        else:
            import kafka  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_client_kind(value: str | None) -> str:
    """``kafka.client``: ``confluent`` or ``kafka-python``; unset means confluent-kafka when
    it imports (it is several times faster), else kafka-python."""
    if value is None or not value.strip():
        return CONFLUENT if client_importable(CONFLUENT) else KAFKA_PYTHON
    kind = value.strip().lower()
    if kind not in CLIENT_KINDS:
        raise KafkaSourceError(
            f"Option 'kafka.client' must be one of {', '.join(repr(k) for k in CLIENT_KINDS)}, got {value!r}.")
    return kind


def _import_client(kind: str) -> Any:
    try:
        if kind == CONFLUENT:
            import confluent_kafka

            return confluent_kafka
        import kafka

        return kafka
    except ImportError as exc:
        package = "confluent-kafka" if kind == CONFLUENT else "kafka-python"
        raise KafkaSourceError(
            f"kafka.client={kind!r} but {package} is not installed in this Python ({exc}); install the "
            "'kafka' extra (pip install 'streaming_merge[kafka]') or choose the other client with "
            "the option 'kafka.client'.") from exc


# ----------------------------------------------------------------------------- kafka.* options

# Spark's Kafka source refuses these, with these reasons (KafkaSourceProvider); so do we.
SPARK_MANAGED_OPTIONS: Mapping[str, str] = {
    "group.id": "user-specified consumer groups are not used to track offsets",
    "auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or 'latest' to specify where to "
                         "start. Structured Streaming manages which offsets are consumed internally, rather than "
                         "relying on the Kafka consumer to do it; 'startingOffsets' only applies when a new "
                         "streaming query is started, resuming always picks up from where the query left off",
    "key.deserializer": "keys are always read as bytes; use DataFrame operations to deserialize them",
    "value.deserializer": "values are always read as bytes; use DataFrame operations to deserialize them",
    "enable.auto.commit": "Spark checkpoints the offsets; committing them to Kafka would need a consumer group",
    "interceptor.classes": "interceptors can modify the payload, so they are not safe",
    "enable.partition.eof": "the source relies on end-of-partition events to finish a range",
}

# Java-only names that librdkafka spells differently.
_CONFLUENT_RENAMES = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
}


def _enum(*allowed: str, upper: bool = True) -> Callable[[str, str], str]:
    def convert(name: str, value: str) -> str:
        normal = value.strip().upper() if upper else value.strip().lower()
        if normal not in allowed:
            raise KafkaSourceError(
                f"Option 'kafka.{name}' must be one of {', '.join(allowed)} for kafka.client=kafka-python, "
                f"got {value!r}.")
        return normal
    return convert


def _int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError as exc:
        raise KafkaSourceError(f"Option 'kafka.{name}' must be an integer, got {value!r}.") from exc


def _bool(name: str, value: str) -> bool:
    normal = value.strip().lower()
    if normal not in ("true", "false"):
        raise KafkaSourceError(f"Option 'kafka.{name}' must be 'true' or 'false', got {value!r}.")
    return normal == "true"


def _text(name: str, value: str) -> str:
    return value


def _check_hostname(name: str, value: str) -> bool:
    normal = value.strip().lower()
    if normal not in ("https", "none", ""):
        raise KafkaSourceError(f"Option 'kafka.{name}' must be 'https' or 'none', got {value!r}.")
    return normal == "https"


# Kafka (Java) and librdkafka names → kafka-python keyword arguments. kafka-python does not
# validate enumerations itself (an unknown security_protocol silently means PLAINTEXT), so
# the converters do.
_KAFKA_PYTHON_OPTIONS: Mapping[str, tuple[str, Callable[[str, str], Any]]] = {
    "client.id": ("client_id", _text),
    "client.rack": ("client_rack", _text),
    "client.dns.lookup": ("client_dns_lookup", _text),
    "security.protocol": ("security_protocol", _enum("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    "sasl.mechanism": ("sasl_mechanism",
                       _enum("PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")),
    "sasl.mechanisms": ("sasl_mechanism",
                        _enum("PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")),
    "sasl.username": ("sasl_plain_username", _text),
    "sasl.password": ("sasl_plain_password", _text),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", _text),
    "ssl.ca.location": ("ssl_cafile", _text),
    "ssl.certificate.location": ("ssl_certfile", _text),
    "ssl.key.location": ("ssl_keyfile", _text),
    "ssl.key.password": ("ssl_password", _text),
    "ssl.crl.location": ("ssl_crlfile", _text),
    "ssl.cipher.suites": ("ssl_ciphers", _text),
    "ssl.endpoint.identification.algorithm": ("ssl_check_hostname", _check_hostname),
    "request.timeout.ms": ("request_timeout_ms", _int),
    "retry.backoff.ms": ("retry_backoff_ms", _int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", _int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", _int),
    "connections.max.idle.ms": ("connections_max_idle_ms", _int),
    "metadata.max.age.ms": ("metadata_max_age_ms", _int),
    "fetch.min.bytes": ("fetch_min_bytes", _int),
    "fetch.max.bytes": ("fetch_max_bytes", _int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", _int),
    "fetch.wait.max.ms": ("fetch_max_wait_ms", _int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", _int),
    "max.poll.records": ("max_poll_records", _int),
    "receive.buffer.bytes": ("receive_buffer_bytes", _int),
    "socket.receive.buffer.bytes": ("receive_buffer_bytes", _int),
    "send.buffer.bytes": ("send_buffer_bytes", _int),
    "socket.send.buffer.bytes": ("send_buffer_bytes", _int),
    "check.crcs": ("check_crcs", _bool),
    "isolation.level": ("isolation_level", _enum("read_uncommitted", "read_committed", upper=False)),
}

_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# The mechanisms each JAAS login module serves (Kafka's default sasl.mechanism is GSSAPI).
_JAAS_MECHANISMS = {_PLAIN_MODULE: ("PLAIN",), _SCRAM_MODULE: ("SCRAM-SHA-256", "SCRAM-SHA-512")}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
# Java keystore options (mutual TLS): librdkafka reads a PKCS12 keystore itself, kafka-python none.
_KEYSTORE_OPTIONS = ("ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type",
                     "ssl.keystore.key", "ssl.keystore.certificate.chain")


def _jaas_credentials(value: str, mechanism: str | None) -> tuple[str, str]:
    """username and password of a PLAIN or SCRAM ``sasl.jaas.config`` (the Java way Spark
    users pass credentials); neither Python client reads JAAS, both take the pair."""
    module = value.strip().split(None, 1)[0] if value.strip() else ""
    fields = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', value))
    if module not in _JAAS_MECHANISMS or "username" not in fields or "password" not in fields:
        raise KafkaSourceError(
            "Option 'kafka.sasl.jaas.config' can only be translated for PlainLoginModule or ScramLoginModule "
            "with username=\"...\" and password=\"...\"; for other mechanisms set the client's own options "
            "(kafka.sasl.username, kafka.sasl.password, kafka.sasl.mechanism, ...).")
    allowed = _JAAS_MECHANISMS[module]
    if mechanism is None or mechanism.strip().upper() not in allowed:
        raise KafkaSourceError(
            f"Option 'kafka.sasl.jaas.config' uses {module.rsplit('.', 1)[-1]}: set kafka.sasl.mechanism to "
            f"{' or '.join(allowed)} (got {mechanism!r}; Kafka's default is GSSAPI).")
    return fields["username"], fields["password"]


def _checked_mechanism(kind: str, options: Mapping[str, str]) -> str | None:
    mechanism = options.get("sasl.mechanism", options.get("sasl.mechanisms"))
    if mechanism is None:
        return None
    normal = mechanism.strip().upper()
    if normal not in SASL_MECHANISMS:
        raise KafkaSourceError(f"Option 'kafka.sasl.mechanism' must be one of {', '.join(SASL_MECHANISMS)}, "
                               f"got {mechanism!r}.")
    if kind == KAFKA_PYTHON and normal == "OAUTHBEARER":
        raise KafkaSourceError("Option 'kafka.sasl.mechanism=OAUTHBEARER' cannot be translated for kafka-python "
                               "(it takes a token provider object, not options); use kafka.client=confluent with "
                               "librdkafka's sasl.oauthbearer.* options, or Spark's connector.")
    return mechanism


def _security_settings(kind: str, options: dict[str, str]) -> dict[str, Any]:
    """The options that differ between Java and the Python clients (JAAS credentials, Java
    truststores and keystores), translated and taken out of ``options``."""
    from streaming_merge.kafka._clients.truststore import parse_truststore  # it imports this module

    settings: dict[str, Any] = {}
    mechanism = _checked_mechanism(kind, options)
    jaas = options.pop("sasl.jaas.config", None)
    if jaas is not None:
        user, password = _jaas_credentials(jaas, mechanism)
        settings.update({"sasl.username": user, "sasl.password": password} if kind == CONFLUENT
                        else {"sasl_plain_username": user, "sasl_plain_password": password})
    truststore = parse_truststore(options)
    if truststore is not None:
        if "ssl.ca.location" in options:
            raise KafkaSourceError("Set one of 'kafka.ssl.truststore.location' and 'kafka.ssl.ca.location'.")
        settings["ssl.ca.location" if kind == CONFLUENT else "ssl_cafile"] = truststore
    keystore = {name: options.pop(name) for name in _KEYSTORE_OPTIONS if name in options}
    if keystore:
        store_type = keystore.pop("ssl.keystore.type", "JKS").strip().upper()
        if kind != CONFLUENT or store_type != "PKCS12" or set(keystore) - {"ssl.keystore.location",
                                                                           "ssl.keystore.password"}:
            name = "ssl.keystore.type" if kind == CONFLUENT and store_type != "PKCS12" else sorted(keystore)[0]
            raise KafkaSourceError(
                f"Option 'kafka.{name}' cannot be translated for {kind}: a client certificate (mutual TLS) is "
                "read from a PKCS12 keystore by kafka.client=confluent only; otherwise give it as PEM files "
                "(kafka.ssl.certificate.location, kafka.ssl.key.location, kafka.ssl.key.password).")
        settings.update(keystore)  # librdkafka's ssl.keystore.location/.password are Java's, for PKCS12
    return settings


def translate_options(kind: str, options: Mapping[str, str]) -> tuple[tuple[str, Any], ...]:
    """``kafka.*`` options (prefix removed) as settings of client ``kind``, sorted so that
    equal options give equal cache keys.

    confluent-kafka takes librdkafka names, which are Kafka's for everything common: they
    pass through (after renaming the few Java-only spellings) and librdkafka itself rejects
    unknown names and bad values when the consumer is created. kafka-python takes keyword
    arguments: the common names are mapped and anything else is refused here, never dropped.
    Java's JAAS credentials, truststores and keystores are translated for both
    (``_security_settings``); a truststore becomes a PEM file where the consumer is built.
    """
    remaining = {name.lower(): value for name, value in options.items()}
    for name in remaining:
        if name in SPARK_MANAGED_OPTIONS:
            raise KafkaSourceError(f"Kafka option '{name}' is not supported: {SPARK_MANAGED_OPTIONS[name]}.")
    settings = _security_settings(kind, remaining)
    for name, value in remaining.items():
        if kind == CONFLUENT:
            settings[_CONFLUENT_RENAMES.get(name, name)] = value
            continue
        mapped = _KAFKA_PYTHON_OPTIONS.get(name)
        if mapped is None:
            raise KafkaSourceError(
                f"Kafka option 'kafka.{name}' cannot be passed to kafka-python (kafka.client=kafka-python); "
                f"supported: {', '.join('kafka.' + n for n in sorted(_KAFKA_PYTHON_OPTIONS))}, "
                "kafka.sasl.jaas.config, kafka.ssl.truststore.*. Use kafka.client=confluent for any librdkafka "
                "property.")
        keyword, convert = mapped
        settings[keyword] = convert(name, value)
    return tuple(sorted(settings.items(), key=lambda item: item[0]))


@dataclass(frozen=True)
class ClientSpec:
    """Which client, where, and with which settings: everything a consumer is built from.
    Hashable (a cache key) and picklable (it travels to the executors with the reader)."""

    kind: str
    bootstrap_servers: str
    settings: tuple[tuple[str, Any], ...] = field(default=(), repr=False)  # may hold credentials
    group_id_prefix: str = "spark-kafka-source"
    # How long the driver's metadata calls wait (kafka.default.api.timeout.ms, as the Java client)
    metadata_timeout_s: float = _METADATA_TIMEOUT_S

    def describe(self) -> str:
        return f"{self.kind} at {self.bootstrap_servers}"


def build_consumer(spec: ClientSpec, construct: Callable[[Any], Any]) -> Any:
    """``construct(module)`` with the client module of ``spec`` imported: a consumer (the
    backends say how to build theirs); any failure to build one (bad option, bad value,
    unreachable bootstrap servers for kafka-python) is a KafkaSourceError naming the client."""
    module = _import_client(spec.kind)
    try:
        return construct(module)
    except Exception as exc:  # the clients raise KafkaException, KafkaError, ValueError, TypeError...
        raise KafkaSourceError(f"Cannot create a {spec.kind} consumer for {spec.bootstrap_servers}: {exc}") from exc


# ----------------------------------------------------------------------------- executors: what to read


@dataclass(frozen=True)
class ReadRequest:
    """Offsets [start, end) of one topic partition and how to treat trouble."""

    topic: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool
    poll_timeout_s: float
