"""A throwaway PostgreSQL 15 server for the tests: Debian's binaries
(``/usr/lib/postgresql/15/bin``), a cluster initialised into a temporary folder with
``wal_level=logical`` (Debezium's ``pgoutput`` replication), a unix socket in that folder and a
free loopback port, trust authentication for ``USER`` (a replication superuser), started and
stopped with ``pg_ctl``.

``initdb`` refuses to run as root (the files of a cluster must not belong to root), so as root
every server command runs as the unprivileged ``postgres`` user (Debian's package creates it)
through ``runuser``, and the folder is handed to that user.

SQL goes through ``psql`` (no Python driver in the project's environment): :meth:`execute`
runs statements, :meth:`rows` returns a query's rows as JSON values (``json_agg``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from devtools.kafka_server import free_port
from devtools.processes import log_tail

BIN = Path(os.environ.get("STREAMING_MERGE_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "debezium"
DATABASE = "inventory"
_SERVICE_USER = "postgres"  # who runs the server when we are root
_START_TIMEOUT_S = 60.0


class PostgresError(RuntimeError):
    """Raised when the server does not start or a statement fails (with psql's message)."""


@dataclass
class Postgres:
    """One PostgreSQL cluster in a temporary folder; :meth:`start` / :meth:`stop` (or ``with``)."""

    port: int = field(default_factory=free_port)
    database: str = DATABASE  # what execute, rows and connect_properties use
    _temp: tempfile.TemporaryDirectory[str] | None = None  # None: a view of a server started elsewhere
    workdir: Path | None = None

    @property
    def data(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "socket"

    def _as_service_user(self, command: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return command
        if shutil.which("runuser") is None:
            raise PostgresError("running as root needs `runuser` to start PostgreSQL as the postgres user")
        return ["runuser", "-u", _SERVICE_USER, "--", *command]

    def _run(self, command: list[str], what: str) -> str:
        result = subprocess.run(self._as_service_user(command), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PostgresError(f"{what} failed (exit {result.returncode}): {(result.stdout + result.stderr)[-3000:]}")
        return result.stdout

    def start(self) -> Postgres:
        if not (BIN / "initdb").exists():
            raise PostgresError(f"no PostgreSQL binaries in {BIN} (Debian's postgresql-15 package)")
        self._temp = tempfile.TemporaryDirectory(prefix="postgres-")
        self.workdir = Path(self._temp.name)
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            service = pwd.getpwnam(_SERVICE_USER)
            for path in (self.workdir, self.socket_dir):
                os.chown(path, service.pw_uid, service.pw_gid)
        self._run([str(BIN / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                   "--locale=C.UTF-8", "--no-sync"], "initdb")
        settings = {"wal_level": "logical", "max_replication_slots": "8", "max_wal_senders": "8",
                    "listen_addresses": "'127.0.0.1'", "port": str(self.port),
                    "unix_socket_directories": f"'{self.socket_dir}'", "fsync": "off",
                    "synchronous_commit": "off", "full_page_writes": "off", "timezone": "'UTC'",
                    "shared_buffers": "32MB"}
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        # trust for the test user over the socket and loopback, replication included
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
            "local replication all trust\nhost replication all 127.0.0.1/32 trust\n")
        self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.workdir / "postgres.log"),
                   "-w", "-t", str(int(_START_TIMEOUT_S)), "start"], "pg_ctl start")
        self._wait_until_ready()
        self.execute(f"CREATE DATABASE {DATABASE}", database="postgres")
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            result = subprocess.run([str(BIN / "pg_isready"), "-h", str(self.socket_dir), "-p", str(self.port)],
                                    capture_output=True, check=False)
            if result.returncode == 0:
                return
            time.sleep(0.1)
        raise PostgresError(f"PostgreSQL did not accept connections within {_START_TIMEOUT_S:.0f} s: "
                            f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return log_tail((self.workdir or Path("/nonexistent")) / "postgres.log", lines)

    def _psql(self, database: str, *args: str, stdin: str | None = None) -> str:
        command = [str(BIN / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir),
                   "-p", str(self.port), "-U", USER, "-d", database, *args]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PostgresError(f"psql failed (exit {result.returncode}): {result.stderr[-3000:]}")
        return result.stdout

    def execute(self, sql: str, database: str | None = None) -> None:
        """Run ``sql`` (one or more statements; a script's transactions as written)."""
        self._psql(database or self.database, "-f", "-", stdin=sql)

    def rows(self, query: str, database: str | None = None) -> list[dict[str, Any]]:
        """The rows of ``query`` as dicts, values as PostgreSQL's ``json_agg`` renders them
        (numbers exact as :class:`~decimal.Decimal`)."""
        text = self._psql(database or self.database, "-At", "-c",
                          f"SELECT coalesce(json_agg(q), '[]') FROM ({query}) q")
        parsed: list[dict[str, Any]] = json.loads(text, parse_float=Decimal)
        return parsed

    @property
    def connect_properties(self) -> dict[str, str]:
        """Debezium PostgreSQL connector properties that reach this server."""
        return {"database.hostname": "127.0.0.1", "database.port": str(self.port), "database.user": USER,
                "database.password": "unused", "database.dbname": self.database}

    def new_database(self, name: str) -> Postgres:
        """A new database on this server, and a view of the server that uses it (stopping
        the view stops nothing)."""
        self.execute(f"CREATE DATABASE {name}", database="postgres")
        return dataclasses.replace(self, database=name, _temp=None)

    def stop(self) -> None:
        if self._temp is not None and (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresError):
                self._run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"], "pg_ctl stop")
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
