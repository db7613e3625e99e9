"""The table's commits one at a time, as the change data feed reads them.

A change data reader needs, per version, what delta-rs' snapshot API does not give: the
commit's own ``add``, ``remove`` and ``cdc`` actions (a snapshot only has the reconciled live
files), its ``metaData`` action if any, and its timestamp. So the JSON commit files are read
here directly, through the table's obstore store (local disks and object stores alike), one
GET each; a listing of ``_delta_log/`` (streaming_merge.table.dv_log.list_log) tells which
versions the log still holds.

A commit's timestamp is the one delta-rs' ``load_cdf`` reports, so the two readers agree on
``_commit_timestamp``: the ``commitInfo`` action's ``inCommitTimestamp`` when in-commit
timestamps are on (the protocol's rule; delta-rs reads ``timestamp``, which Delta sets to the
same value then), else ``commitInfo.timestamp`` (delta-rs), else, for a commit without a
``commitInfo``, the commit file's modification time (Delta on Spark's rule for every commit).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import obstore

from streaming_merge.cdf.errors import ChangeDataFeedError
from streaming_merge.table.dv_log import LogListing, list_log
from streaming_merge.table.store import NOT_FOUND, first_line, get_bytes

__all__ = ["Commit", "commit_path", "list_commits", "parse_commit", "read_commit", "read_commits",
           "timestamp_ms"]

_LOG = "_delta_log/"
_ANY_VERSION = 2**63 - 1
# Commits fetched at once when a range is planned: each is one small GET, so on an object store
# the round trips, not the bytes, are the cost.
_FETCH_THREADS = 8


@dataclass(frozen=True)
class Commit:
    """The actions of one JSON commit that the change data feed looks at."""

    version: int
    timestamp_ms: int
    adds: tuple[dict[str, Any], ...]
    removes: tuple[dict[str, Any], ...]
    cdcs: tuple[dict[str, Any], ...]
    metadata: dict[str, Any] | None  # the commit's metaData action, if it has one


def commit_path(version: int) -> str:
    """The commit file's object path inside the table."""
    return f"{_LOG}{version:020d}.json"


def parse_commit(data: bytes, table: str, version: int, modified_ms: Callable[[], int]) -> Commit:
    """The commit's actions; ``modified_ms`` is asked only for a commit without a timestamp in
    its ``commitInfo``. A line that is not JSON fails naming the table, version and line."""
    adds: list[dict[str, Any]] = []
    removes: list[dict[str, Any]] = []
    cdcs: list[dict[str, Any]] = []
    metadata: dict[str, Any] | None = None
    info: dict[str, Any] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise ChangeDataFeedError(f"Line {number} of commit {version} of table `{table}` is not valid JSON: "
                                      f"{exc}") from exc
        if "add" in action:
            adds.append(action["add"])
        elif "remove" in action:
            removes.append(action["remove"])
        elif "cdc" in action:
            cdcs.append(action["cdc"])
        elif "metaData" in action:
            metadata = action["metaData"]
        elif "commitInfo" in action:
            info = action["commitInfo"] or {}
    stamp = info.get("inCommitTimestamp", info.get("timestamp"))
    return Commit(version=version, timestamp_ms=int(stamp) if stamp is not None else modified_ms(),
                  adds=tuple(adds), removes=tuple(removes), cdcs=tuple(cdcs), metadata=metadata)


def read_commit(store: Any, table: str, version: int) -> Commit | None:
    """Commit ``version`` of the table, or None when the log holds no such commit file (not
    committed yet, or cleaned up)."""
    path = commit_path(version)
    try:
        data = get_bytes(store, path)
    except NOT_FOUND:
        return None
    except Exception as exc:
        raise ChangeDataFeedError(f"Cannot read commit {version} of table `{table}`: {first_line(exc)}") from exc

    def modified_ms() -> int:
        return int(obstore.head(store, path)["last_modified"].timestamp() * 1000)

    return parse_commit(data, table, version, modified_ms)


def read_commits(store: Any, table: str, versions: Iterable[int]) -> dict[int, Commit | None]:
    """Several commits read at once (a few GETs in flight); None for the missing ones."""
    wanted = list(versions)
    if len(wanted) <= 1:
        return {v: read_commit(store, table, v) for v in wanted}
    with ThreadPoolExecutor(min(_FETCH_THREADS, len(wanted))) as pool:
        return dict(zip(wanted, pool.map(lambda v: read_commit(store, table, v), wanted), strict=True))


def list_commits(store: Any, table: str, from_version: int | None = None) -> LogListing:
    """Every commit (and checkpoint) the log holds, from ``from_version`` on when given."""
    try:
        return list_log(store, table, _ANY_VERSION, from_version)
    except Exception as exc:  # list_log names the version it was asked for, which means nothing here
        raise ChangeDataFeedError(f"Cannot list the log of table `{table}`: {first_line(exc)}") from exc


def timestamp_ms(store: Any, table: str, version: int, cache: dict[int, int]) -> int:
    """Commit ``version``'s timestamp (see the module docstring), remembered in ``cache``."""
    if version not in cache:
        commit = read_commit(store, table, version)
        if commit is None:
            raise ChangeDataFeedError(f"Commit {version} of table `{table}` vanished from the log while its "
                                      "timestamp was being read (log cleanup?); retry.")
        cache[version] = commit.timestamp_ms
    return cache[version]
