"""Fast checks of the broker the Kafka tests stand on: the embedded broker's lifecycle leaves
no process behind, records round-trip with keys, headers and timestamps, end offsets are
exact when producing one record per batch, and unsupported admin operations fail clearly.

Round-trip tests run on whichever broker the session uses (Tansu or Apache Kafka); the
lifecycle tests start their own embedded broker."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from streaming_merge.kafka.broker import (
    BrokerFeatureUnsupportedError,
    EmbeddedKafka,
    KafkaBrokerClient,
    KafkaBrokerError,
    Record,
)


def _process_gone(pid: int) -> bool:
    """True when ``pid`` no longer exists (not even as a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_refuses(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return False
    except OSError:
        return True


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int, timeout_s: float = 20) -> list:
    """Records with offsets in [start, end) of one partition, read the way the Spark source
    does (assign + seek + poll, stop at ``end``); fails if they do not all arrive in time."""
    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="none")
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(records)} of {end - start} records in {timeout_s}s"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(r for r in batch if r.offset < end)
        return records
    finally:
        consumer.close()


# -- lifecycle of the embedded broker ---------------------------------------------------------


def test_start_stop_leaves_no_process() -> None:
    broker = EmbeddedKafka().start()
    pid = broker.pid
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    assert pid is not None and broker.running
    assert os.getpgid(pid) == pid, "the broker leads its own process group"
    assert host == "127.0.0.1"
    assert broker.client().topics() is not None

    broker.stop()

    assert _process_gone(pid)
    assert not broker.running
    assert _port_refuses(host, int(port))
    with pytest.raises(KafkaBrokerError, match="not running"):
        _ = broker.bootstrap_servers
    broker.stop()  # idempotent


def test_context_manager_stops_on_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), EmbeddedKafka() as broker:
        pid = broker.pid
        raise RuntimeError("boom")
    assert pid is not None and _process_gone(pid)


def test_interpreter_exit_stops_a_broker_never_stopped() -> None:
    code = "from streaming_merge.kafka.broker import EmbeddedKafka; print(EmbeddedKafka().start().pid)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert _process_gone(int(out.stdout.strip().splitlines()[-1]))


def test_only_loopback_hosts() -> None:
    with pytest.raises(KafkaBrokerError, match="loopback"):
        EmbeddedKafka(host="0.0.0.0")
    with pytest.raises(KafkaBrokerError, match="loopback"):
        EmbeddedKafka(host="localhost.example.com")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-broker"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_broker_that_exits_fails_with_log_tail(tmp_path: Path) -> None:
    binary = _script(tmp_path, "echo 'cannot bind: address in use' >&2; exit 3")
    with pytest.raises(KafkaBrokerError, match=r"exited with code 3(.|\n)*cannot bind"):
        EmbeddedKafka(binary=binary, start_timeout_s=5).start()


def test_broker_that_never_answers_times_out_and_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    binary = _script(tmp_path, f"echo $$ > {pid_file}; exec sleep 120")
    broker = EmbeddedKafka(binary=binary, start_timeout_s=0.5, stop_timeout_s=2)
    with pytest.raises(KafkaBrokerError, match="did not open"):
        broker.start()
    pid = int(pid_file.read_text())
    assert _process_gone(pid)


# -- round trips on the session broker --------------------------------------------------------


def test_produce_consume_round_trip(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic(partitions=2)
    sent = [
        Record(value=b'{"id": 1}', key=b"k1", headers=(("op", b"c"), ("empty", b"")), timestamp_ms=1_700_000_000_000),
        Record(value='{"id": 2}', key="k2", timestamp_ms=1_700_000_000_001),
        Record(value=None, key=b"k1", timestamp_ms=1_700_000_000_002),  # tombstone
        Record(value=b"\x00\xffnot json", key=None, timestamp_ms=1_700_000_000_003),
    ]
    acks = kafka_broker.produce(topic, sent, partition=1)

    assert [(a.partition, a.offset) for a in acks] == [(1, i) for i in range(4)]
    assert kafka_broker.offsets(topic) == {0: (0, 0), 1: (0, 4)}

    got = read_range(kafka_broker.bootstrap_servers, topic, 1, 0, 4)
    assert [r.offset for r in got] == [0, 1, 2, 3]
    assert [r.key for r in got] == [b"k1", b"k2", b"k1", None]
    assert [r.value for r in got] == [b'{"id": 1}', b'{"id": 2}', None, b"\x00\xffnot json"]
    assert [r.timestamp for r in got] == [1_700_000_000_000 + i for i in range(4)]
    assert [r.timestamp_type for r in got] == [0, 0, 0, 0]  # CreateTime
    assert got[0].headers == [("op", b"c"), ("empty", b"")]
    assert got[1].headers == []


def test_end_offsets_exact_one_record_per_batch(
    kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=3)
    acks = kafka_broker.produce(topic, [(f"key-{i}", f"v{i}") for i in range(30)])
    per_partition: dict[int, int] = {}
    for ack in acks:
        assert ack.offset == per_partition.get(ack.partition, 0), "offsets are dense per partition"
        per_partition[ack.partition] = ack.offset + 1
    assert kafka_broker.offsets(topic) == {p: (0, per_partition.get(p, 0)) for p in range(3)}
    assert sum(end for _, end in kafka_broker.offsets(topic).values()) == 30


def test_read_range_from_the_middle(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic()
    kafka_broker.produce(topic, [f"v{i}".encode() for i in range(10)], partition=0)
    got = read_range(kafka_broker.bootstrap_servers, topic, 0, 3, 7)
    assert [(r.offset, r.value) for r in got] == [(i, f"v{i}".encode()) for i in range(3, 7)]


def test_topics_listed_for_a_pattern(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    a = kafka_topic(prefix="cdc.inventory.orders")
    b = kafka_topic(prefix="cdc.inventory.items")
    other = kafka_topic(prefix="audit")
    pattern = re.compile(re.escape("cdc.inventory.") + r".*")
    matched = {t for t in kafka_broker.topics() if pattern.fullmatch(t)}
    assert {a, b} <= matched
    assert other not in matched


def test_add_partitions(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic(partitions=1)
    if kafka_broker.kind == "tansu":
        with pytest.raises(BrokerFeatureUnsupportedError, match="CreatePartitions"):
            kafka_broker.add_partitions(topic, 3)
        assert kafka_broker.partition_count(topic) == 1
        return
    kafka_broker.add_partitions(topic, 3)
    assert kafka_broker.partition_count(topic) == 3
    ack = kafka_broker.produce(topic, [b"x"], partition=2)[0]
    assert (ack.partition, ack.offset) == (2, 0)


def test_delete_records(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic()
    kafka_broker.produce(topic, [b"a", b"b", b"c"], partition=0)
    if kafka_broker.kind == "tansu":
        with pytest.raises(BrokerFeatureUnsupportedError, match="DeleteRecords"):
            kafka_broker.delete_records(topic, 0, 2)
        return
    kafka_broker.delete_records(topic, 0, 2)
    assert kafka_broker.offsets(topic) == {0: (2, 3)}


def test_create_existing_topic_fails_clearly(kafka_broker: KafkaBrokerClient, kafka_topic: Callable[..., str]) -> None:
    topic = kafka_topic()
    with pytest.raises(KafkaBrokerError, match="already exists"):
        kafka_broker.create_topic(topic, 1)
