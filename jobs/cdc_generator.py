"""Generated Debezium change streams and the state they must produce.

Used by the embedded demo, the Kafka tests and the ingestion benchmark. Events carry a
global ``source.lsn``; the stream deliberately contains duplicates (producer retries),
out-of-order late events (an old update re-sent after newer ones), deletes of keys that
never existed, re-inserts after deletes, and optionally malformed records.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

TABLES: dict[str, dict[str, Any]] = {
    "customers": {"key": "id", "schema": "id long, name string, email string, tier string",
                  "make": lambda rng, k, lsn: {"id": k, "name": f"cust-{k}-{lsn}", "email": f"c{k}@example.com",
                                              "tier": rng.choice(["gold", "silver", "bronze"])}},
    "orders": {"key": "order_id", "schema": "order_id long, customer_id long, amount double, status string",
               "make": lambda rng, k, lsn: {"order_id": k, "customer_id": rng.randrange(50),
                                           "amount": round(rng.uniform(1, 500), 2),
                                           "status": rng.choice(["new", "paid", "shipped"])}},
}

MALFORMED = [b"not json at all", b'{"payload": {"after": {"id": 1}}}', b'{"op": "x", "after": {}}',
             b'{"op": "t", "ts_ms": 1, "source": {"lsn": 1}}', b'{"op": "c", "source": {"lsn": 2}}']


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None


def envelope(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, lsn: int,
             wrapped: bool) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000 + lsn,
               "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000 + lsn, "connector": "postgresql"}}
    body = {"schema": {"type": "struct", "name": "envelope"}, "payload": payload} if wrapped else payload
    return json.dumps(body).encode()


def generate(table: str, events: int, keys: int, seed: int, malformed: bool = True
             ) -> tuple[list[Record], dict[int, dict[str, Any]]]:
    """(records in produce order, expected final rows by key)."""
    spec = TABLES[table]
    key_name = spec["key"]
    rng = random.Random(seed)
    state: dict[int, dict[str, Any]] = {}
    latest_lsn: dict[int, int] = {}
    records: list[Record] = []
    sent: list[Record] = []
    lsn = seed * 1_000_000
    for _ in range(events):
        lsn += 1
        k = rng.randrange(keys)
        if k in state and rng.random() < 0.25:
            op, before, after = "d", state.pop(k), None
        elif k in state:
            op, before, after = "u", state[k], spec["make"](rng, k, lsn)
        else:
            op, before, after = rng.choice(["c", "r"]), None, spec["make"](rng, k, lsn)
        if rng.random() < 0.05 and op != "d" and k not in state:  # delete of a key that does not exist
            op, before, after = "d", {key_name: k}, None
        if after is not None:
            state[k] = after
        latest_lsn[k] = lsn
        record = Record(str(k).encode(), envelope(op, before, after, lsn, wrapped=rng.random() < 0.5))
        records.append(record)
        sent.append(record)
        if op == "d" and rng.random() < 0.5:
            records.append(Record(str(k).encode(), None))  # Kafka tombstone after a delete
        if rng.random() < 0.08:
            records.append(rng.choice(sent))  # duplicate or late re-send of an older event
    if malformed:
        for value in MALFORMED:
            records.insert(rng.randrange(len(records)), Record(b"bad", value))
    return records, state


def expected_rows(state: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return dict(state)
