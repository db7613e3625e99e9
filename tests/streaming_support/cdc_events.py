"""A deterministic CDC event generator and the reference model the sink must agree with.

Events carry a global sequence (``lsn``); files deliberately mix old and new events so
batches arrive out of order, with duplicates, deletes of missing keys and re-inserts.
The model is the definition of the sink's contract with ``sequence_by``: for each key
the event with the highest lsn decides, and the key exists iff that event is not a
delete, whatever order the batches came in.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

SCHEMA = "id int, lsn long, op string, name string, amount int"


def generate(seed: int, batches: int, events_per_batch: int, keys: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    events = []
    for lsn in range(1, batches * events_per_batch + 1):
        key = rng.randrange(keys)
        op = rng.choices(["c", "u", "d"], weights=[4, 4, 2])[0]
        events.append({"id": key, "lsn": lsn, "op": op,
                       "name": None if op == "d" else f"n{key}-{lsn}",
                       "amount": None if op == "d" else rng.randrange(1000)})
    # Out of order: shuffle within a sliding window, so later batches hold older events.
    for i in range(len(events)):
        j = min(len(events) - 1, i + rng.randrange(events_per_batch))
        events[i], events[j] = events[j], events[i]
    # Exact duplicates (a producer retry) inside and across batches.
    for _ in range(max(1, len(events) // 10)):
        events.insert(rng.randrange(len(events)), dict(rng.choice(events)))
    size = len(events) // batches
    return [events[i * size:(i + 1) * size] if i < batches - 1 else events[i * size:] for i in range(batches)]


def expected_state(batches: list[list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    latest: dict[int, dict[str, Any]] = {}
    for batch in batches:
        for event in batch:
            if event["id"] is None:
                continue
            if event["id"] not in latest or event["lsn"] > latest[event["id"]]["lsn"]:
                latest[event["id"]] = event
    return {k: e for k, e in latest.items() if e["op"] != "d"}


def write_files(folder: str, batches: list[list[dict[str, Any]]]) -> None:
    """One JSON-lines file per batch, named so the file source reads them in order."""
    os.makedirs(folder, exist_ok=True)
    for index, batch in enumerate(batches):
        path = os.path.join(folder, f"batch-{index:04d}.json")
        with open(path + ".tmp", "w") as handle:
            for event in batch:
                handle.write(json.dumps(event) + "\n")
        os.replace(path + ".tmp", path)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def table_state(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["id"]: {k: r[k] for k in ("id", "lsn", "op", "name", "amount")} for r in rows}
