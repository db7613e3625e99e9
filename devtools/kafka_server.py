"""Apache Kafka itself for the tests and benchmarks: one KRaft node (broker and controller in
one JVM) from its Maven Central jars, with a PLAINTEXT listener and a SASL_SSL one whose CA,
keystore and truststore are generated at start (``keytool``, from the JDK that runs Kafka).

SASL_SSL takes PLAIN and SCRAM-SHA-256 with the user ``USER``/``PASSWORD``."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from devtools.jars import kafka_classpath
from devtools.processes import kill_group, log_tail, stop_group
from streaming_merge.kafka.broker_client import KafkaBrokerClient

USER = "alice"
PASSWORD = "alice-secret"
STORE_PASSWORD = "changeit"
_START_TIMEOUT_S = 90.0
_LOG4J = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


class KafkaServerError(RuntimeError):
    """Raised when the Kafka (or Kafka Connect) JVM does not come up."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    return str(candidate) if candidate and candidate.exists() else (shutil.which("java") or "java")


def keytool() -> str:
    return str(Path(java()).resolve().parent / "keytool")


@dataclass(frozen=True)
class TlsFiles:
    """The CA (PEM and a JKS truststore) and the broker's keystore."""

    ca_pem: Path
    truststore_jks: Path
    truststore_p12: Path
    keystore: Path
    password: str = STORE_PASSWORD


def make_tls(folder: Path) -> TlsFiles:
    """A CA and a broker certificate for 127.0.0.1/localhost signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_store, keystore = folder / "ca.p12", folder / "broker.p12"
    common = ["-storepass", STORE_PASSWORD, "-keypass", STORE_PASSWORD, "-noprompt"]

    def run(*args: str, stdin: bytes | None = None) -> bytes:
        result = subprocess.run([keytool(), *args], input=stdin, capture_output=True, check=False)
        if result.returncode != 0:
            raise KafkaServerError(f"keytool {' '.join(args[:2])} failed: {result.stderr.decode()[-2000:]}")
        return result.stdout

    run("-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048", "-dname", "CN=streaming_merge test CA",
        "-ext", "bc:c", "-validity", "30", "-keystore", str(ca_store), "-storetype", "PKCS12", *common)
    run("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-dname", "CN=localhost",
        "-validity", "30", "-keystore", str(keystore), "-storetype", "PKCS12", *common)
    request = run("-certreq", "-alias", "broker", "-keystore", str(keystore), *common)
    signed = run("-gencert", "-alias", "ca", "-keystore", str(ca_store), "-ext", "SAN=dns:localhost,ip:127.0.0.1",
                 "-validity", "30", "-rfc", *common, stdin=request)
    ca_pem = folder / "ca.pem"
    ca_pem.write_bytes(run("-exportcert", "-alias", "ca", "-keystore", str(ca_store), "-rfc", *common))
    run("-importcert", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(keystore), *common)
    run("-importcert", "-alias", "broker", "-keystore", str(keystore), *common, stdin=signed)
    truststore_jks, truststore_p12 = folder / "truststore.jks", folder / "truststore.p12"
    for store, kind in ((truststore_jks, "JKS"), (truststore_p12, "PKCS12")):
        run("-importcert", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(store), "-storetype", kind, *common)
    return TlsFiles(ca_pem=ca_pem, truststore_jks=truststore_jks, truststore_p12=truststore_p12, keystore=keystore)


def _cluster_id() -> str:
    """A random KRaft cluster id. Kafka's own generator skips ids that start with '-', which
    ``kafka-storage format -t`` would read as an option; so does this one."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass
class ApacheKafka:
    """A one-node KRaft Kafka in ``workdir`` (a temporary folder by default)."""

    workdir: Path | None = None
    heap: str = "768m"
    plaintext_port: int = field(default_factory=free_port)
    sasl_ssl_port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    tls: TlsFiles | None = None
    _process: subprocess.Popen[bytes] | None = None
    _temp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.plaintext_port}"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        return f"localhost:{self.sasl_ssl_port}"

    def sasl_ssl_options(self, mechanism: str = "PLAIN", truststore: str = "pem") -> dict[str, str]:
        """``kafka.*`` source options (Spark's connector's names) for the SASL_SSL listener: the
        credentials as a JAAS line, the CA as a PEM file or a JKS/PKCS12 truststore."""
        assert self.tls is not None
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        options = {"kafka.bootstrap.servers": self.sasl_ssl_bootstrap_servers,
                   "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": mechanism,
                   "kafka.sasl.jaas.config": f'{module} required username="{USER}" password="{PASSWORD}";'}
        if truststore == "pem":
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(self.tls.ca_pem)
        else:
            store = self.tls.truststore_jks if truststore == "jks" else self.tls.truststore_p12
            options["kafka.ssl.truststore.location"] = str(store)
            options["kafka.ssl.truststore.password"] = self.tls.password
            options["kafka.ssl.truststore.type"] = "JKS" if truststore == "jks" else "PKCS12"
        return options

    def start(self) -> ApacheKafka:
        if self.workdir is None:
            self._temp = tempfile.TemporaryDirectory(prefix="apache-kafka-")
            self.workdir = Path(self._temp.name)
        self.tls = make_tls(self.workdir / "tls")
        properties = self.workdir / "server.properties"
        properties.write_text(self._properties())
        (self.workdir / "log4j2.properties").write_text(_LOG4J)
        cluster_id = _cluster_id()
        scram = f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"
        self._java(["kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id, "-c", str(properties),
                    "--add-scram", scram], wait=True)
        log = (self.workdir / "kafka.log").open("wb")
        self._process = self._java(["kafka.Kafka", str(properties)], stdout=log)
        self._wait_until_ready()
        return self

    def _properties(self) -> str:
        assert self.workdir is not None and self.tls is not None
        jaas_plain = (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                      f'username="{USER}" password="{PASSWORD}" user_{USER}="{PASSWORD}";')
        lines = {
            "process.roles": "broker,controller", "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.plaintext_port},SASL_SSL://localhost:{self.sasl_ssl_port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": (f"PLAINTEXT://127.0.0.1:{self.plaintext_port},"
                                     f"SASL_SSL://localhost:{self.sasl_ssl_port}"),
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"), "num.partitions": "1",
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1", "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0", "auto.create.topics.enable": "true",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas_plain,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.location": str(self.tls.keystore), "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": self.tls.password, "ssl.key.password": self.tls.password,
        }
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def _java(self, args: list[str], wait: bool = False, stdout: IO[bytes] | None = None) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        command = [java(), f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                   "-cp", f"{kafka_classpath()}/*", *args]
        if wait:
            result = subprocess.run(command, capture_output=True, check=False)
            if result.returncode != 0:
                raise KafkaServerError(f"{args[0]} failed: {(result.stdout + result.stderr).decode()[-3000:]}")
            return None  # type: ignore[return-value]
        return subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise KafkaServerError(f"Kafka exited with {self._process.returncode}: {self.log_tail()}")
            try:
                with KafkaBrokerClient(self.bootstrap_servers, kind="kafka", timeout_s=5) as client:
                    client.topics()
                return
            except Exception:
                time.sleep(0.3)
        raise KafkaServerError(f"Kafka did not answer within {_START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return log_tail((self.workdir or Path("/nonexistent")) / "kafka.log", lines)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL the broker's JVM, like a machine dying: no controlled shutdown, so the next
        start recovers its logs. Its log directory, ports, cluster id and TLS files stay, for
        :meth:`restart`."""
        kill_group(self._process)
        self._process = None

    def restart(self) -> ApacheKafka:
        """Start the broker again on the log directory and ports of :meth:`start` (after
        :meth:`kill`): the same properties, storage already formatted, so the topics, their
        records and the committed offsets are the ones it had."""
        if self.workdir is None or not (self.workdir / "server.properties").exists():
            raise KafkaServerError("restart() needs a broker that was started (its workdir holds its storage)")
        if self.running:
            raise KafkaServerError("restart() of a broker that is running: kill() it first")
        with (self.workdir / "kafka.log").open("ab") as log:  # the JVM holds its own descriptor
            self._process = self._java(["kafka.Kafka", str(self.workdir / "server.properties")], stdout=log)
        self._wait_until_ready()
        return self

    def stop(self) -> None:
        stop_group(self._process)
        self._process = None
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    def client(self) -> KafkaBrokerClient:
        return KafkaBrokerClient(self.bootstrap_servers, kind="kafka")

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

