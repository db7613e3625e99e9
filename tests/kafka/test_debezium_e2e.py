"""Real Debezium, end to end: SQL on PostgreSQL 15 → Debezium's PostgreSQL connector (pgoutput)
on Kafka Connect → Apache Kafka → the multi-table job → Delta, and every Delta table equal to
its PostgreSQL table, value for value and type for type.

Two connectors watch the same database at once, one with the JSON converter's schemas on and
one with them off, under their own topic prefixes; one job (``--subscribe-pattern`` over both
prefixes, ``{root}/{prefix}/{table}``) ingests both. With schemas on, the tables are created
from Debezium's schemas; with schemas off, they exist beforehand with the user's types (and the
user adds the new column to the Delta table too), and the table's types decode the values.

The job is SIGKILLed between two tables' commits of its first batch and started again, to
run on (a batch a second) through the rest; Kafka Connect is SIGKILLed mid-stream, before it
commits the source offsets of changes it has sent, and restarted, so Debezium sends them
again. Every table must be exact after each phase. Two job starts, one PostgreSQL and one
Connect worker per test session (tests/kafka/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from deltalake.schema import Field, PrimitiveType

from devtools.connect import KafkaConnect, lsn_number
from devtools.kafka_server import ApacheKafka
from devtools.postgres import Postgres
from streaming_merge.kafka.broker_client import KafkaBrokerClient

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("items", "orders", "events")
META = [("_cdc_op", pa.string()), ("_cdc_position", pa.int64()), ("_cdc_ts_ms", pa.int64()),
        ("_kafka_partition", pa.int32()), ("_kafka_offset", pa.int64())]

SCHEMA_SQL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (id int PRIMARY KEY, price numeric(12,3), qty numeric, born date, seen timestamp,
                    at timestamptz, opens time, ref uuid, doc jsonb, raw json, blob bytea, tags text[],
                    scores int[], feel mood, ok boolean, note text);
CREATE TABLE orders (id bigint PRIMARY KEY, item_id int, amount numeric(10,2), placed date);
CREATE TABLE events (id int PRIMARY KEY, kind text);
INSERT INTO items VALUES
  (1, 12.345, 3.14159, '2024-02-29', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.5+02', '23:59:59.999999',
   'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"b": [1, 2], "a": null}', '{"kept":  "as typed"}', '\\x00ff10',
   '{"x", "y z"}', '{1, NULL, -3}', 'happy', true, 'snapshot'),
  (2, -0.001, -12345678901234567890.5, '1969-12-31', '1900-01-01 00:00:00', '1970-01-01 00:00:00+00', '00:00:00',
   NULL, '[]', 'null', '\\x', '{}', '{}', 'sad', false, NULL),
  (3, 999999999.999, 0, '9999-12-31', '2262-04-11 23:47:16.854775', '2100-06-01 12:00:00-07:30', '12:30:00.5',
   'ffffffff-ffff-ffff-ffff-ffffffffffff', '{"nested": {"deep": true}}', '1', '\\xdeadbeef', '{""}', '{0}', 'ok',
   NULL, 'to delete');
"""

PHASE_1 = """
INSERT INTO items (id) VALUES (4);
INSERT INTO items VALUES (5, 1, 1e-10, '2000-01-01', '2000-01-01 00:00:00.000001', now(), '01:02:03', gen_random_uuid(),
  '{"k": "v"}', '[1, 2]', '\\x01', '{"a"}', '{7}', 'ok', true, 'new');
UPDATE items SET price = price + 1, feel = 'sad', seen = NULL WHERE id = 1;
DELETE FROM items WHERE id = 3;
UPDATE items SET id = 20 WHERE id = 2;
BEGIN;
INSERT INTO orders VALUES (1, 1, 10.50, '2024-02-29'), (2, 5, -3.25, NULL);
UPDATE items SET note = 'ordered' WHERE id IN (1, 5);
INSERT INTO events VALUES (1, 'order'), (2, 'order');
COMMIT;
UPDATE orders SET amount = 99999999.99 WHERE id = 1;
"""
PHASE_1_LAST = "INSERT INTO events VALUES (3, 'last of phase 1')"

PHASE_2A = """
ALTER TABLE items ADD COLUMN extra int;
UPDATE items SET extra = 7, at = '2030-01-01 00:00:00+05' WHERE id = 1;
INSERT INTO items (id, price, extra, tags) VALUES (7, 0.001, 8, '{}');
"""
TICK = "INSERT INTO events SELECT coalesce(max(id), 0) + 1, 'tick' FROM events"  # a change past the others
PHASE_2A_RETRY = ["UPDATE items SET extra = extra + 1 WHERE id = 7"] * 2
PHASE_2B = """
TRUNCATE events;
INSERT INTO events VALUES (10, 'after the truncate');
DELETE FROM orders WHERE id = 2;
UPDATE items SET extra = NULL, doc = '{"z": 1}' WHERE id = 20;
"""
PHASE_2B_LAST = "UPDATE orders SET placed = '1999-12-31' WHERE id = 1"


def off_schema() -> dict[str, pa.Schema]:
    """The schemas-off tables as their user creates them (the types Debezium's schemas give)."""
    items = [("id", pa.int32()), ("price", pa.decimal128(12, 3)), ("qty", pa.decimal128(38, 18)),
             ("born", pa.date32()), ("seen", pa.timestamp("us")), ("at", pa.timestamp("us", tz="UTC")),
             ("opens", pa.int64()), ("ref", pa.string()), ("doc", pa.string()), ("raw", pa.string()),
             ("blob", pa.binary()), ("tags", pa.list_(pa.string())), ("scores", pa.list_(pa.int32())),
             ("feel", pa.string()), ("ok", pa.bool_()), ("note", pa.string())]
    return {"items": pa.schema(items + META),
            "orders": pa.schema([("id", pa.int64()), ("item_id", pa.int32()), ("amount", pa.decimal128(10, 2)),
                                 ("placed", pa.date32()), *META]),
            "events": pa.schema([("id", pa.int32()), ("kind", pa.string()), *META])}


def pg_state(pg: Postgres, table: str) -> tuple[list[str], dict[Any, dict[str, Any]]]:
    """(column names in table order, rows by id) with PostgreSQL's values as Python values of
    the Spark types the job maps them to."""
    columns = pg.rows(f"SELECT column_name AS c, data_type AS t FROM information_schema.columns "
                      f"WHERE table_name = '{table}' ORDER BY ordinal_position")
    select = ", ".join(f"{c['c']}::text AS {c['c']}" if c["t"] in ("json", "jsonb") else c["c"] for c in columns)
    kinds = {c["c"]: c["t"] for c in columns}
    rows = {}
    for row in pg.rows(f"SELECT {select} FROM {table}"):
        rows[row["id"]] = {name: _python(kinds[name], value) for name, value in row.items()}
    return [c["c"] for c in columns], rows


def _python(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "numeric":
        return Decimal(value)
    if kind == "date":
        return date.fromisoformat(value)
    if kind.startswith("timestamp"):
        return datetime.fromisoformat(value)
    if kind.startswith("time "):
        clock = datetime.strptime(value if "." in value else value + ".0", "%H:%M:%S.%f")
        return ((clock.hour * 60 + clock.minute) * 60 + clock.second) * 1_000_000 + clock.microsecond
    if kind == "bytea":
        return bytes.fromhex(value[2:])
    return value


def delta_state(path: Path) -> tuple[list[str], dict[Any, dict[str, Any]]]:
    """(``name type`` of each row column in table order, rows by id)."""
    table = deltalake.DeltaTable(str(path))
    fields = [f for f in table.schema().fields if not f.name.startswith(("_cdc_", "_kafka_"))]
    rows = table.to_pyarrow_table(columns=[f.name for f in fields]).to_pylist()
    state = {row["id"]: row for row in rows}
    assert len(state) == len(rows), f"{path}: a key twice"
    return [f"{f.name} {f.type!r}" for f in fields], state


def expected_columns(table: str, columns: list[str]) -> list[str]:
    """``name type`` of the Delta columns of the PostgreSQL columns: the types of the type
    mapping (docs/guides/kafka.md#types), which Debezium's schemas must give too."""
    types = {f.name: f.type for f in deltalake.Schema.from_arrow(off_schema()[table]).fields}
    types["extra"] = PrimitiveType("integer")
    return [f"{name} {types[name]!r}" for name in columns]


def differences(pg: Postgres, lake: Path, prefixes: tuple[str, ...]) -> dict[tuple[str, str], Any]:
    """What differs between each PostgreSQL table and its Delta tables (empty: all exact)."""
    found: dict[tuple[str, str], Any] = {}
    for table in TABLES:
        columns, expected = pg_state(pg, table)
        for prefix in prefixes:
            if not (lake / prefix / table / "_delta_log").exists():
                found[prefix, table] = "no Delta table"
                continue
            names, actual = delta_state(lake / prefix / table)
            differing = {k: (actual.get(k), expected.get(k)) for k in actual.keys() | expected.keys()
                         if actual.get(k) != expected.get(k)}
            if names != expected_columns(table, columns) or differing:
                found[prefix, table] = (names, differing)
    return found


def published_once(pg: Postgres, connect: KafkaConnect, names: tuple[str, ...], sql: str, last: str) -> None:
    """Run ``sql``, then ``last``; return once every connector has committed past ``last``'s change."""
    if sql:
        pg.execute(sql)
    lsn = lsn_number(pg.rows("SELECT pg_current_wal_insert_lsn()::text AS l")[0]["l"])
    pg.execute(last)
    for name in names:
        connect.wait_published(name, lsn)


def job_command(workdir: Path, bootstrap: str, pattern: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "tests.streaming_support.database_ingest_app", "--bootstrap-servers", bootstrap,
            "--subscribe-pattern", pattern, "--target-root", str(workdir / "lake"),
            "--table-path-template", "{root}/{prefix}/{table}", "--apply-truncates",
            "--checkpoint", str(workdir / "checkpoint"), "--dead-letter", str(workdir / "dead_letter"),
            "--max-offsets-per-trigger", "100000", "--progress", str(workdir / "events.jsonl"), *options]


def start_job(workdir: Path, command: list[str]) -> subprocess.Popen[bytes]:
    """The job in its own process group (its JVM with it), its output in ``job.log``."""
    with (workdir / "job.log").open("ab") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})


def job_log(workdir: Path) -> str:
    return (workdir / "job.log").read_text(errors="replace")[-3000:]


def stop_job(job: subprocess.Popen[bytes]) -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:.0f} s"
        time.sleep(0.1)


def exact_soon(pg: Postgres, lake: Path, prefixes: tuple[str, ...], job: subprocess.Popen[bytes], workdir: Path,
               timeout_s: float = 240.0) -> None:
    """Until the running job has made every table exact (it must not die meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while found := differences(pg, lake, prefixes):
        assert job.poll() is None, f"the job exited with {job.returncode}: {job_log(workdir)}"
        assert time.monotonic() < deadline, f"not exact within {timeout_s:.0f} s: {found}"
        time.sleep(1.0)


def crash_connect_before_its_commit(pg: Postgres, connect: KafkaConnect, kafka: ApacheKafka,
                                    prefixes: tuple[str, ...], statements: list[str]) -> int:
    """Run ``statements[0]`` and SIGKILL Kafka Connect as soon as its changes are in Kafka, before
    it commits their source offsets, then start it again: Debezium sends them again. Connect
    commits every ``offset_flush_ms``, so a kill can come too late; the next statement then
    tries again. Returns how many records the restart sent again."""
    topics = [f"{prefix}.public.items" for prefix in prefixes]
    with KafkaBrokerClient(kafka.bootstrap_servers, kind="kafka") as client:
        def ends() -> list[int]:
            return [client.offsets(topic)[0][1] for topic in topics]
        for sql in statements:
            before = ends()
            pg.execute(sql)
            until(lambda before=before: all(e > b for e, b in zip(ends(), before, strict=True)),
                  "the changes in Kafka")
            sent = ends()
            connect.restart()
            for prefix in prefixes:
                connect.wait_running(prefix)
            published_once(pg, connect, prefixes, "", TICK)
            again = sum(ends()) - sum(sent)  # nothing changed since: every new record is one sent again
            if again:
                return again
    raise AssertionError(f"Kafka Connect committed before each of {len(statements)} kills: nothing sent again")


def topic_values(kafka: ApacheKafka, topic: str) -> list[dict[str, Any]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest",
                             consumer_timeout_ms=2000, enable_auto_commit=False)
    try:
        return [json.loads(m.value) for m in consumer if m.value is not None]
    finally:
        consumer.close()


@pytest.mark.slow
def test_postgres_through_debezium_to_delta_is_exact_in_both_converter_modes_across_kills(
        tmp_path: Path, postgres: Postgres, kafka_connect: KafkaConnect, apache_kafka: ApacheKafka) -> None:
    run = uuid.uuid4().hex[:6]
    pg = postgres.new_database(f"db_{run}")
    pg.execute(SCHEMA_SQL)
    on, off = f"on_{run}", f"off_{run}"
    prefixes = (on, off)
    lake = tmp_path / "lake"
    for table, schema in off_schema().items():  # the schemas-off tables, created by their user
        deltalake.write_deltalake(str(lake / off / table), schema.empty_table())
    for prefix, schemas in ((on, True), (off, False)):
        kafka_connect.create_postgres_connector(prefix, pg.connect_properties, prefix, schemas=schemas)
    published_once(pg, kafka_connect, prefixes, PHASE_1, PHASE_1_LAST)
    command = job_command(tmp_path, apache_kafka.bootstrap_servers, rf"(?:{on}|{off})\.public\..*")

    # Phase 1 (snapshot, inserts, updates, a delete, a key change, a transaction over three
    # tables): the job dies between two tables' commits of its first batch, then runs on.
    killed = start_job(tmp_path, [*command, "--kill-at", "0:1"])
    assert killed.wait(timeout=600) == -9, job_log(tmp_path)
    job = start_job(tmp_path, [*command, "--processing-time", "1 second"])
    try:
        exact_soon(pg, lake, prefixes, job, tmp_path)

        # Phase 2: a column added mid-stream (the schemas-off table's user adds it first),
        # Kafka Connect killed before it commits those changes and restarted (they come
        # again), then a TRUNCATE, a delete and more.
        deltalake.DeltaTable(str(lake / off / "items")).alter.add_columns(Field("extra", PrimitiveType("integer")))
        again = crash_connect_before_its_commit(pg, kafka_connect, apache_kafka, prefixes, [PHASE_2A, *PHASE_2A_RETRY])
        published_once(pg, kafka_connect, prefixes, PHASE_2B, PHASE_2B_LAST)
        exact_soon(pg, lake, prefixes, job, tmp_path)
    finally:
        stop_job(job)
    assert not (tmp_path / "dead_letter").exists() or \
        deltalake.DeltaTable(str(tmp_path / "dead_letter")).to_pyarrow_table().num_rows == 0

    # Debezium's order is the LSN: every event of the topic carries it, snapshot reads too.
    values = topic_values(apache_kafka, f"{on}.public.items")
    assert all(isinstance(v["payload"]["source"]["lsn"], int) for v in values)
    assert {v["payload"]["op"] for v in values} >= {"r", "c", "u", "d"}
    print(f"items events: {len(values)} per prefix; records sent again after the Connect crash: {again}")
