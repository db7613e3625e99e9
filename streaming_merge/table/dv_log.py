"""The live ``add`` actions of a table, with their deletion-vector descriptors, replayed from
the Delta log.

delta-rs 1.6.6 does not expose them: ``get_add_actions`` has no ``deletionVector`` column
and ``deletion_vectors()`` returns only decoded keep-masks. MERGE needs the descriptors
themselves (to remove the old logical file ``(path, dvId)`` when it commits a new DV) and the
add action as the log holds it (to add the file again with its new DV), so the file actions
are replayed here, as the protocol's action reconciliation defines: the newest checkpoint not
after the version, then the JSON commits after it, in order. Only tables whose protocol has
deletion vectors are replayed.

A streaming job asks for the next version every batch, so results are cached per
``(table, version)`` and a newer version is derived from the newest cached older one by
applying just the commits in between. A cached state also keeps the identity (entity tag,
size, modification time) of the commit file it was replayed up to, and is used only while
that file is still the one in the log: a table restored from a copy at the same place keeps
its id and its version numbers, but not its commit files.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import obstore
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streaming_merge.errors import DeltaTableError, InvalidArgumentError
from streaming_merge.table.deletion_vectors import DeletionVector
from streaming_merge.table.store import NOT_FOUND, first_line, get_bytes, table_store

__all__ = ["LogListing", "clear_cache", "deletion_vector_descriptors", "list_log", "live_adds", "newest_checkpoint"]

_LOG = "_delta_log/"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID_NAMED = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")
_CACHE_SIZE = 32

# One table version's state: live data file (decoded path) -> its add action as the log has it.
_State = dict[str, dict[str, Any]]
# A file action: (kind, decoded path, the action's JSON object).
_Action = tuple[str, str, dict[str, Any]]


def deletion_vector_descriptors(
    table_url: str, storage_options: Mapping[str, str] | None, version: int
) -> dict[str, DeletionVector]:
    """For every live file of the table at ``version`` that has a DV, its descriptor, keyed
    by the add's ``path`` URL-decoded (relative to the table root, as the rest of the
    package keys files). Raises :class:`DeltaTableError` when the log no longer (or not yet)
    holds ``version``."""
    return {path: DeletionVector.from_json(add["deletionVector"])
            for path, add in live_adds(table_url, storage_options, version).items() if add.get("deletionVector")}


def live_adds(table_url: str, storage_options: Mapping[str, str] | None, version: int,
              table_id: str | None = None) -> dict[str, dict[str, Any]]:
    """Every live file's ``add`` action at ``version``, keyed by its URL-decoded path (the
    actions are shared with a cache: do not modify them). ``table_id`` (the metaData id) keeps a
    table dropped and created again at the same place from being answered from the old one's
    cache."""
    if version < 0:
        raise DeltaTableError(f"Table `{table_url}` has no version {version}")
    table = table_url.rstrip("/")
    key = table if table_id is None else f"{table}#{table_id}"
    store = table_store(table, storage_options)
    cached = _cache.lookup(key, version)
    replayed: _Replayed | None = None
    if cached is not None and _commit_identity(store, table, cached.version) != cached.commit:
        _cache.forget(key)  # the log was replaced under the same id: nothing cached holds
        cached = None
    if cached is not None and cached.version == version:
        return dict(cached.state)
    if cached is not None:
        replayed = _advance(store, table, cached, version)
    if replayed is None:
        replayed = _replay(store, table, version)
    if replayed.commit is not None:
        _cache.store(key, replayed)
    return dict(replayed.state)


def clear_cache() -> None:
    """Forget every cached state (tests; a table dropped and created again at one place)."""
    _cache.clear()


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Replayed:
    """A table's state at ``version``, with the identity of that version's commit file (None
    when the log holds only a checkpoint there, and the state cannot be checked later)."""

    version: int
    state: _State
    commit: str | None


class _Cache:
    """A small thread-safe LRU of replayed states keyed by ``(table, version)``. States are
    never mutated once stored (callers get copies), so lookups can share them without locking."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._states: OrderedDict[tuple[str, int], _Replayed] = OrderedDict()

    def lookup(self, table: str, version: int) -> _Replayed | None:
        """The state at ``version`` if cached, else the newest cached older one (to advance)."""
        with self._lock:
            key = (table, version)
            if key in self._states:
                self._states.move_to_end(key)
                return self._states[key]
            older = [v for (t, v) in self._states if t == table and v < version]
            return self._states[(table, max(older))] if older else None

    def store(self, table: str, replayed: _Replayed) -> None:
        with self._lock:
            self._states[(table, replayed.version)] = replayed
            self._states.move_to_end((table, replayed.version))
            while len(self._states) > self._size:
                self._states.popitem(last=False)

    def forget(self, table: str) -> None:
        with self._lock:
            for key in [k for k in self._states if k[0] == table]:
                del self._states[key]

    def clear(self) -> None:
        with self._lock:
            self._states.clear()


_cache = _Cache(_CACHE_SIZE)


# ---------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------


def _commit_name(version: int) -> str:
    return f"{_LOG}{version:020d}.json"


def _identity(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('e_tag')}/{meta['size']}/{meta['last_modified'].isoformat()}"


def _commit_identity(store: Any, table: str, version: int) -> str | None:
    """The identity of commit ``version``'s file; None when the log no longer holds it."""
    try:
        return _identity(obstore.head(store, _commit_name(version)))
    except NOT_FOUND:
        return None
    except Exception as exc:
        raise _error(table, version, f"cannot read commit {version}: {first_line(exc)}") from exc


def _read_commit(store: Any, version: int) -> tuple[bytes, str]:
    """A JSON commit's bytes and its file's identity, in one request."""
    result = obstore.get(store, _commit_name(version))
    return bytes(result.bytes()), _identity(result.meta)


def _advance(store: Any, table: str, base: _Replayed, version: int) -> _Replayed | None:
    """``base`` moved on to ``version`` by its JSON commits, read by name without listing;
    None when one of them is missing (cleaned up, or not committed yet), and the caller falls
    back to a full replay, which reports it properly."""
    advanced = dict(base.state)
    commit = base.commit
    for v in range(base.version + 1, version + 1):
        try:
            data, commit = _read_commit(store, v)
        except NOT_FOUND:
            return None
        except Exception as exc:
            raise _error(table, version, f"cannot read commit {v}: {first_line(exc)}") from exc
        _apply(advanced, _file_actions(data, table, v))
    return _Replayed(version, advanced, commit)


@dataclass
class LogListing:
    """What ``_delta_log/`` holds up to a version: each commit's last-modified time (epoch ms),
    by version, and the complete checkpoints, by version: [(kind, [(path, size)])], kind being
    "classic", "parquet" (multi-part or UUID-named) or "json"."""

    commits: dict[int, int]
    checkpoints: dict[int, list[tuple[str, list[tuple[str, int]]]]]


def _replay(store: Any, table: str, version: int) -> _Replayed:
    """The state at ``version`` from the newest complete checkpoint not after it plus the
    JSON commits after that checkpoint. ``_last_checkpoint`` only narrows the listing."""
    hint = _last_checkpoint_version(store)
    listing = list_log(store, table, version, hint if hint is not None and hint <= version else None)
    if hint is not None and hint <= version and not _complete_checkpoints(listing, version):
        listing = list_log(store, table, version, None)  # a stale or broken hint
    if version not in listing.commits and version not in _complete_checkpoints(listing, version):
        raise _error(table, version, "the log holds no commit for it (expired and cleaned up, or not committed yet)")
    checkpoints = _complete_checkpoints(listing, version)
    start = max(checkpoints) if checkpoints else -1
    missing = [v for v in range(start + 1, version + 1) if v not in listing.commits]
    if missing:
        gone = f"commit {missing[0]} is missing from the log (expired and cleaned up?)"
        reason = f"there is no complete checkpoint at or before it and {gone}" if start < 0 else gone
        raise _error(table, version, reason)
    state: _State = {}
    commit: str | None = None
    try:
        if start >= 0:
            _apply(state, _checkpoint_adds(store, table, checkpoints[start]))
        for v in range(start + 1, version + 1):
            data, commit = _read_commit(store, v)
            _apply(state, _file_actions(data, table, v))
        if commit is None:
            commit = _commit_identity(store, table, version)
    except DeltaTableError:
        raise
    except Exception as exc:
        raise _error(table, version, f"cannot read the log: {first_line(exc)}") from exc
    return _Replayed(version, state, commit)


def _dv_id(action: Mapping[str, Any]) -> str | None:
    vector = action.get("deletionVector")
    return None if not vector else DeletionVector.from_json(vector).unique_id


def _apply(state: _State, actions: Iterable[_Action]) -> None:
    """Reconcile file actions into ``state``, in log order. A logical file is ``(path, dvId)``
    and a path has at most one live one, the newest added: an add replaces whatever the path
    had, a remove drops the path only if its DV is the live one. So ``remove(p, dv1)`` and
    ``add(p, dv2)`` in one commit give ``(p, dv2)`` in either order."""
    for kind, path, body in actions:
        if kind == "add":
            state[path] = body
        else:
            live = state.get(path)
            if live is not None and _dv_id(live) == _dv_id(body):
                del state[path]


def _file_actions(data: bytes, table: str, version: int) -> Iterator[_Action]:
    """``(kind, decoded path, action)`` of the add and remove actions of one JSON commit."""
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
            for kind in ("add", "remove"):
                body = action.get(kind)
                if body is not None:
                    _dv_id(body)  # a malformed descriptor fails here, naming the commit
                    yield kind, unquote(body["path"]), body
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _error(table, version, f"line {number} of commit {version} is not a valid action: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Listing and checkpoints
# ---------------------------------------------------------------------------------------------


def _last_checkpoint_version(store: Any) -> int | None:
    """The version ``_last_checkpoint`` points at; None when absent or unreadable (it is only
    a hint)."""
    try:
        return int(json.loads(_get(store, f"{_LOG}_last_checkpoint"))["version"])
    except Exception:
        return None


def list_log(store: Any, table: str, version: int, from_version: int | None = None) -> LogListing:
    """Commits and checkpoints up to ``version``, from ``from_version`` on when given (object
    stores list in key order after the offset, so a hint saves listing old entries)."""
    offset = None if from_version is None else f"{_LOG}{from_version:020d}"
    listing = LogListing(commits={}, checkpoints={})
    parts: dict[tuple[int, int], dict[int, tuple[str, int]]] = {}
    try:
        for batch in obstore.list(store, _LOG, offset=offset):
            for meta in batch:
                name = meta["path"][len(_LOG) :] if meta["path"].startswith(_LOG) else meta["path"]
                if "/" in name or not name[:1].isdigit():
                    continue
                n = int(name[:20]) if name[:20].isdigit() else -1
                if n < 0 or n > version:
                    continue
                entry = (meta["path"], int(meta["size"]))
                if _COMMIT.match(name):
                    listing.commits[n] = int(meta["last_modified"].timestamp() * 1000)
                elif _CLASSIC.match(name):
                    listing.checkpoints.setdefault(n, []).append(("classic", [entry]))
                elif m := _UUID_NAMED.match(name):
                    listing.checkpoints.setdefault(n, []).append((m.group(2), [entry]))
                elif m := _MULTIPART.match(name):
                    parts.setdefault((n, int(m.group(3))), {})[int(m.group(2))] = entry
    except Exception as exc:
        raise _error(table, version, f"cannot list `_delta_log`: {first_line(exc)}") from exc
    # A multi-part checkpoint counts only with all its parts (a writer may have died midway).
    for (n, total), found in parts.items():
        if len(found) == total and set(found) == set(range(1, total + 1)):
            files = [found[i] for i in range(1, total + 1)]
            listing.checkpoints.setdefault(n, []).append(("parquet", files))
    return listing


def _complete_checkpoints(listing: LogListing, version: int) -> dict[int, tuple[str, list[tuple[str, int]]]]:
    """One usable checkpoint per version <= ``version``, preferring a classic single file."""
    order = {"classic": 0, "parquet": 1, "json": 2}
    return {
        n: min(found, key=lambda c: order[c[0]])
        for n, found in listing.checkpoints.items()
        if n <= version
    }


def _checkpoint_adds(store: Any, table: str, checkpoint: tuple[str, list[tuple[str, int]]]) -> Iterator[_Action]:
    """The adds of a checkpoint (all its parts, and its sidecars for V2). Removes are not
    needed: a checkpoint is already reconciled, its removes are only tombstones."""
    kind, files = checkpoint
    for path, size in files:
        if kind == "json":
            actions = [json.loads(line) for line in _get(store, path).splitlines() if line.strip()]
            for action in actions:
                add = action.get("add")
                if add is not None:
                    yield "add", unquote(add["path"]), add
            sidecars = [a["sidecar"]["path"] for a in actions if a.get("sidecar") is not None]
        else:
            parquet = _open_parquet(store, path, size)
            yield from _parquet_adds(parquet)
            sidecars = _parquet_sidecars(parquet)
        for sidecar in sidecars:
            yield from _parquet_adds(_open_parquet(store, _sidecar_path(table, sidecar), None))


def _sidecar_path(table: str, sidecar: str) -> str:
    """A sidecar's object path: relative ones live in ``_delta_log/_sidecars/``; absolute ones
    must be inside the table (the store is rooted there)."""
    if "://" not in sidecar:
        return f"{_LOG}_sidecars/{unquote(sidecar)}"
    if sidecar.startswith(table + "/"):
        return unquote(sidecar[len(table) + 1 :])
    raise InvalidArgumentError(f"sidecar `{sidecar}` lies outside the table")


def _parquet_adds(parquet: pq.ParquetFile) -> Iterator[_Action]:
    """The checkpoint's add actions as the JSON log spells them (maps as objects; the parsed
    stats and partition values that some writers add beside the JSON text are left out)."""
    add_type = _field_type(parquet.schema_arrow, "add")
    if add_type is None or not isinstance(add_type, pa.StructType):
        return
    wanted = [add_type.field(i).name for i in range(add_type.num_fields)
              if not add_type.field(i).name.endswith("_parsed")]
    adds = parquet.read(columns=[f"add.{name}" for name in wanted]).column("add").combine_chunks()
    for add in pc.filter(adds, pc.is_valid(adds)).to_pylist():
        action = {k: dict(v) if k in _MAP_FIELDS and v is not None else v for k, v in add.items()}
        yield "add", unquote(str(action["path"])), action


_MAP_FIELDS = frozenset({"partitionValues", "tags"})


def _parquet_sidecars(parquet: pq.ParquetFile) -> list[str]:
    sidecar_type = _field_type(parquet.schema_arrow, "sidecar")
    if sidecar_type is None:
        return []
    sidecars = parquet.read(columns=["sidecar.path"]).column("sidecar").combine_chunks()
    return [p for p in pc.filter(sidecars.field("path"), pc.is_valid(sidecars)).to_pylist() if p]


def _field_type(schema: pa.Schema, name: str) -> pa.DataType | None:
    index = schema.get_field_index(name)
    return None if index < 0 else schema.field(index).type


def newest_checkpoint(listing: LogListing, version: int) -> tuple[str, list[tuple[str, int]]] | None:
    """The newest complete checkpoint at or before ``version``: (kind, [(path, size)])."""
    checkpoints = _complete_checkpoints(listing, version)
    return checkpoints[max(checkpoints)] if checkpoints else None


def _get(store: Any, path: str) -> bytes:
    return get_bytes(store, path)


def _open_parquet(store: Any, path: str, size: int | None) -> pq.ParquetFile:
    """A Parquet file read with ranged GETs (footer, then the selected column chunks)."""
    return pq.ParquetFile(pa.PythonFile(_RangedFile(obstore.open_reader(store, path, size=size)), mode="r"))


class _RangedFile:
    """The file-object surface pyarrow's ``PythonFile`` needs, over obstore's ReadableFile
    (which lacks ``closed`` / ``readable``)."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.closed = False

    def read(self, size: int | None = -1) -> bytes:
        return bytes(self._reader.read() if size is None or size < 0 else self._reader.read(size))

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._reader.seek(offset, whence))

    def tell(self) -> int:
        return int(self._reader.tell())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._reader.close()


def _error(table: str, version: int, reason: str) -> DeltaTableError:
    return DeltaTableError(f"Cannot read the deletion vectors of table `{table}` at version {version}: {reason}")
