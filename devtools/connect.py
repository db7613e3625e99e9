"""Kafka Connect for the tests: one distributed worker (``ConnectDistributed``, Apache Kafka
4.4's jars) with Debezium's PostgreSQL connector plugin on its ``plugin.path``, its REST API
on a free loopback port, its config/offset/status topics on the given broker.

Helpers create a Debezium PostgreSQL connector (``pgoutput``, TRUNCATE events on, the JSON
converter with or without schemas), wait until it and its task run, read its committed
source offset (to know Debezium has published everything up to an LSN) and restart the
worker (SIGKILL then start: the changes after the last committed offset are delivered again,
as after a crash). Readiness is polled through REST, with deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.jars import debezium_plugins, kafka_classpath
from devtools.kafka_server import _LOG4J, KafkaServerError, free_port, java
from devtools.processes import kill_group, log_tail, stop_group

_START_TIMEOUT_S = 120.0


def lsn_number(text: str) -> int:
    """PostgreSQL's ``X/Y`` LSN text as the number Debezium writes in ``source.lsn``."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass
class KafkaConnect:
    """A distributed Kafka Connect worker bound to ``bootstrap_servers``."""

    bootstrap_servers: str
    heap: str = "512m"
    rest_port: int = field(default_factory=free_port)
    # Source offsets are committed this often: the changes after the last commit are
    # delivered again when the worker dies (what restart() exercises).
    offset_flush_ms: int = 2000
    workdir: Path | None = None
    _process: subprocess.Popen[bytes] | None = None
    _temp: tempfile.TemporaryDirectory[str] | None = None
    _group: str = field(default_factory=lambda: f"connect-{os.getpid()}-{free_port()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def start(self) -> KafkaConnect:
        if self.workdir is None:
            self._temp = tempfile.TemporaryDirectory(prefix="kafka-connect-")
            self.workdir = Path(self._temp.name)
        (self.workdir / "log4j2.properties").write_text(_LOG4J)
        group = self._group
        settings = {
            "bootstrap.servers": self.bootstrap_servers, "group.id": group,
            "config.storage.topic": f"{group}-config", "offset.storage.topic": f"{group}-offsets",
            "status.storage.topic": f"{group}-status", "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1", "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1", "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.flush.interval.ms": str(self.offset_flush_ms),
            "listeners": f"http://127.0.0.1:{self.rest_port}", "rest.advertised.host.name": "127.0.0.1",
            "plugin.path": str(debezium_plugins()), "plugin.discovery": "only_scan",
            "scheduled.rebalance.max.delay.ms": "0", "task.shutdown.graceful.timeout.ms": "2000",
        }
        (self.workdir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self._launch()
        return self

    def _launch(self) -> None:
        assert self.workdir is not None
        command = [java(), f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                   "-cp", f"{kafka_classpath()}/*", "org.apache.kafka.connect.cli.ConnectDistributed",
                   str(self.workdir / "worker.properties")]
        log = (self.workdir / "connect.log").open("ab")
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._until(lambda: self._request("GET", "/connector-plugins") is not None, "its REST API answers")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer, or None when the worker does not answer (yet) or answers 404/409."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 409):  # not there yet, or a rebalance in progress
                return None
            raise KafkaServerError(f"Kafka Connect {method} {path}: HTTP {exc.code} {exc.read().decode()[-2000:]}"
                                   ) from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
        return json.loads(text) if text else {}

    def _until(self, condition: Any, what: str, timeout_s: float = _START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise KafkaServerError(f"Kafka Connect exited with {self._process.returncode}: {self.log_tail()}")
            if condition():
                return
            time.sleep(0.2)
        raise KafkaServerError(f"Kafka Connect: not {what} within {timeout_s:.0f} s: {self.log_tail()}")

    def create_postgres_connector(self, name: str, database: dict[str, str], topic_prefix: str,
                                  schemas: bool, tables: str | None = None) -> None:
        """A Debezium PostgreSQL connector (its own slot and publication), running when this returns."""
        converter = "org.apache.kafka.connect.json.JsonConverter"
        config = {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": "1",
            **database, "topic.prefix": topic_prefix, "plugin.name": "pgoutput",
            "slot.name": f"slot_{name}".replace("-", "_"), "publication.name": f"pub_{name}".replace("-", "_"),
            "publication.autocreate.mode": "all_tables", "skipped.operations": "none",
            "key.converter": converter, "value.converter": converter,
            "key.converter.schemas.enable": str(schemas).lower(),
            "value.converter.schemas.enable": str(schemas).lower(),
            "snapshot.mode": "initial", "status.update.interval.ms": "1000",
        }
        if tables:
            config["table.include.list"] = tables
        if self._request("PUT", f"/connectors/{name}/config", config) is None:
            raise KafkaServerError(f"Kafka Connect did not take the connector {name}")
        self.wait_running(name)

    def wait_running(self, name: str, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Until the connector and every task of it are RUNNING (a FAILED one raises with its trace)."""
        def running() -> bool:
            status = self._request("GET", f"/connectors/{name}/status")
            if not status:
                return False
            for task in status.get("tasks", []):
                if task.get("state") == "FAILED":
                    raise KafkaServerError(f"connector {name} task failed: {task.get('trace', '')[-3000:]}")
            return bool(status.get("tasks")) and status["connector"]["state"] == "RUNNING" and \
                all(t.get("state") == "RUNNING" for t in status["tasks"])
        self._until(running, f"running connector {name}", timeout_s)

    def committed_lsn(self, name: str) -> int | None:
        """The LSN of the connector's last committed source offset (None before the first commit)."""
        answer = self._request("GET", f"/connectors/{name}/offsets")
        offsets = [o.get("offset") or {} for o in (answer or {}).get("offsets", [])]
        values = [int(v) for o in offsets for k, v in o.items() if k in ("lsn", "lsn_proc") and v is not None]
        return max(values) if values else None

    def wait_published(self, name: str, lsn: int, timeout_s: float = 60.0) -> None:
        """Until the connector committed an offset at or past ``lsn``: every change before it is
        in Kafka (Connect commits a source offset only once the records before it are acknowledged)."""
        self._until(lambda: (self.committed_lsn(name) or -1) >= lsn, f"published up to LSN {lsn} by {name}",
                    timeout_s)

    def restart(self) -> None:
        """SIGKILL the worker and start it again (its connectors resume from their committed offsets)."""
        self._kill()
        self._launch()

    def _kill(self) -> None:
        kill_group(self._process)
        self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail((self.workdir or Path("/nonexistent")) / "connect.log", lines)

    def stop(self) -> None:
        stop_group(self._process)
        self._process = None
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    def __enter__(self) -> KafkaConnect:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
