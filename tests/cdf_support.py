"""Helpers of the change data feed tests: rows of either reader in one comparable form, and
tables with change data on built from the Delta Lake fixtures."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa

from tests.delta_fixtures import FIXTURES

CDF_ON = {"delta.enableChangeDataFeed": "true"}


def comparable(table: pa.Table, columns: list[str] | None = None) -> Counter[tuple[Any, ...]]:
    """Rows as tuples in ``columns`` order (default: the table's), timestamps as epoch
    milliseconds and every string or integer type widened: delta-rs returns string views,
    unsigned versions and naive millisecond timestamps, Spark strings, longs and UTC
    microseconds."""
    names = columns or table.column_names
    arrays = []
    for name in names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
        elif pa.types.is_string_view(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        elif pa.types.is_unsigned_integer(column.type):
            column = column.cast(pa.int64())
        arrays.append(column.to_pylist())
    return Counter(zip(*arrays, strict=True))


def delta_rs_changes(path: str | Path, starting_version: int = 0, ending_version: int | None = None
                     ) -> pa.Table:
    """delta-rs ``load_cdf`` read to Arrow."""
    return pa.table(deltalake.DeltaTable(str(path)).load_cdf(starting_version=starting_version,
                                                             ending_version=ending_version))


def writable_copy(name: str, tmp_path: Path) -> Path:
    """A fixture table copied into ``tmp_path`` (the shared folder is read-only)."""
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    for item in [copy, *copy.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)
    return copy


def with_change_data_feed_from_the_start(path: Path) -> None:
    """Set ``delta.enableChangeDataFeed=true`` in the table's first metaData action, by hand:
    its later DV commits (which carry no cdc actions) then read as change data. A protocol
    with table features lists changeDataFeed too, as a writer must (Delta refuses it otherwise)."""
    first = path / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in first.read_text().splitlines() if line.strip()]
    for action in actions:
        if "metaData" in action:
            action["metaData"]["configuration"].update(CDF_ON)
        features = action.get("protocol", {}).get("writerFeatures")
        if features is not None and "changeDataFeed" not in features:
            features.append("changeDataFeed")
    first.write_text("".join(json.dumps(a) + "\n" for a in actions))


def append_commit(path: Path, actions: list[dict[str, Any]], timestamp_ms: int) -> int:
    """Write the next commit of ``path`` by hand; returns its version."""
    log = path / "_delta_log"
    version = max(int(p.name[:20]) for p in log.glob("*.json")) + 1
    lines = [{"commitInfo": {"timestamp": timestamp_ms, "operation": "MANUAL"}}, *actions]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in lines))
    return version


def commit_actions(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
