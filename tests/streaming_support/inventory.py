"""Debezium change events of a small three-table database (``inventory``), for the
multi-table job's tests, with the expected state of each table computed independently.

- ``customers`` (id int): plain JSON record keys ``{"id": 1}``, schema-wrapped envelopes;
- ``orders`` (order_number long): schema-wrapped record keys, plain envelopes;
- ``products`` (warehouse string, sku long): a composite plain key, plain envelopes.

Every table gets inserts, updates and deletes (each delete followed by its tombstone), with
increasing LSNs; a few malformed values are mixed in (they must reach the dead letter).
The expected state is a dict per table, key tuple → data columns, replaying the events in
order on plain dicts (no code of the job).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

TABLES: dict[str, dict[str, Any]] = {
    "customers": {"keys": ("id",), "columns": [("id", "int32"), ("name", "string"), ("tier", "int32")],
                  "wrapped_key": False, "wrapped_value": True},
    "orders": {"keys": ("order_number",), "columns": [("order_number", "int64"), ("customer", "int64"),
                                                      ("quantity", "int32"), ("note", "string")],
               "wrapped_key": True, "wrapped_value": False},
    "products": {"keys": ("warehouse", "sku"), "columns": [("warehouse", "string"), ("sku", "int64"),
                                                          ("stock", "int64")],
                 "wrapped_key": False, "wrapped_value": False},
}
MALFORMED = b'{"op": "c", "after": {"broken": '  # not JSON


def envelope_schema(table: str, columns: list[tuple[str, str]]) -> dict[str, Any]:
    """The ``schema`` part of a schema-wrapped Debezium record of ``table``."""
    row = {"type": "struct", "optional": True, "name": f"dbserver1.inventory.{table}.Value",
           "fields": [{"type": t, "optional": True, "field": n} for n, t in columns]}
    return {"type": "struct", "optional": False, "name": f"dbserver1.inventory.{table}.Envelope",
            "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                       {"type": "struct", "optional": False, "field": "source",
                        "fields": [{"type": "int64", "optional": True, "field": "lsn"}]},
                       {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"}]}


def record_key(table: str, row: dict[str, Any], wrapped: bool | None = None) -> bytes:
    spec = TABLES[table]
    key = {k: row[k] for k in spec["keys"]}
    if wrapped if wrapped is not None else spec["wrapped_key"]:
        schema = {"type": "struct", "name": f"dbserver1.inventory.{table}.Key",
                  "fields": [{"type": t, "optional": False, "field": n} for n, t in spec["columns"]
                             if n in spec["keys"]]}
        return json.dumps({"schema": schema, "payload": key}).encode()
    return json.dumps(key).encode()


def change_value(table: str, op: str, row: dict[str, Any], lsn: int, wrapped: bool | None = None,
                 columns: list[tuple[str, str]] | None = None) -> bytes:
    payload = {"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op,
               "ts_ms": 1_700_000_000_000 + lsn, "source": {"lsn": lsn}}
    spec = TABLES[table]
    if wrapped if wrapped is not None else spec["wrapped_value"]:
        return json.dumps({"schema": envelope_schema(table, columns or spec["columns"]), "payload": payload}).encode()
    return json.dumps(payload).encode()


@dataclass
class Inventory:
    """Per table: the Kafka records in produce order, the expected rows, the malformed values."""

    records: dict[str, list[tuple[bytes, bytes | None]]] = field(default_factory=dict)
    expected: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    malformed: dict[str, list[bytes]] = field(default_factory=dict)


def row(table: str, key: int, rng: random.Random) -> dict[str, Any]:
    """A random row of ``table`` with key number ``key``."""
    if table == "customers":
        return {"id": key, "name": f"c{key}-{rng.randrange(1000)}", "tier": rng.randrange(3)}
    if table == "orders":
        return {"order_number": 10_000 + key, "customer": rng.randrange(50), "quantity": rng.randrange(1, 9),
                "note": rng.choice([None, "gift", "rush"])}
    return {"warehouse": f"w{key % 3}", "sku": 100 + key, "stock": rng.randrange(500)}


def generate(events_per_table: int, keys_per_table: int, seed: int, malformed_per_table: int = 1) -> Inventory:
    rng = random.Random(seed)
    inventory = Inventory()
    lsn = 0
    for table, spec in TABLES.items():
        records: list[tuple[bytes, bytes | None]] = []
        state: dict[tuple[Any, ...], dict[str, Any]] = {}
        bad_at = set(rng.sample(range(events_per_table), malformed_per_table))
        for i in range(events_per_table):
            lsn += 1
            if i in bad_at:
                records.append((b"bad", MALFORMED))
                inventory.malformed.setdefault(table, []).append(MALFORMED)
                continue
            image = row(table, rng.randrange(keys_per_table), rng)
            key = tuple(image[k] for k in spec["keys"])
            if key in state and rng.random() < 0.25:
                before = state.pop(key)
                records.append((record_key(table, before), change_value(table, "d", before, lsn)))
                records.append((record_key(table, before), None))  # the tombstone
                continue
            op = "u" if key in state else "c"
            state[key] = image
            records.append((record_key(table, image), change_value(table, op, image, lsn)))
        inventory.records[table] = records
        inventory.expected[table] = state
    return inventory


def table_state(rows: list[dict[str, Any]], table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """A table read back (delta-rs rows) in the form of :attr:`Inventory.expected`; a key
    twice fails."""
    spec = TABLES[table]
    names = [n for n, _ in spec["columns"]]
    state = {tuple(r[k] for k in spec["keys"]): {n: r[n] for n in names} for r in rows}
    assert len(state) == len(rows), f"{table}: a key appears more than once"
    return state
