"""Deletion vectors: Z85, the RoaringBitmapArray, DV files, their IO and the log replay that
finds the descriptors.

Why: a DV read wrongly resurrects deleted rows or loses live ones, and a DV written wrongly
does the same to every other reader of the table. So the bytes are pinned by hand on tiny
cases, checked against the real Delta Spark tables in shared/fixtures (their descriptors
and files), and what we write is read back by delta-rs (its own DV reader and its DataFusion
scan), the engine the rest of the project trusts for the log.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64

from streaming_merge.errors import DeltaTableError
from streaming_merge.table import deletion_vectors as dvs
from streaming_merge.table import dv_log
from streaming_merge.table import store as store_module
from streaming_merge.table.deletion_vectors import (
    MAGIC,
    DeletionVector,
    decode_bitmap,
    delete_dv_file,
    encode_bitmap,
    parse_dv_file_entry,
    read_deleted_rows,
    serialize_dv_file,
    write_deletion_vectors,
    z85_decode,
    z85_encode,
)
from tests.delta_fixtures import FIXTURES

SMALL = FIXTURES / "table-with-dv-small"
LARGE = FIXTURES / "table-with-dv-large"
SMALL_FILE = "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    dv_log.clear_cache()


def _copy_table(source: Path, target: Path) -> Path:
    """A writable copy (the fixtures are read-only, and copytree keeps their modes)."""
    shutil.copytree(source, target)
    for root, dirs, files in os.walk(target):
        for name in dirs + files:
            path = os.path.join(root, name)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    os.chmod(target, os.stat(target).st_mode | stat.S_IWUSR)
    return target


def _rs_deleted(table: Path, version: int | None = None) -> dict[str, set[int]]:
    """delta-rs' view: decoded relative path -> deleted row indexes (False in the keep mask)."""
    dt = DeltaTable(str(table), version=version) if version is not None else DeltaTable(str(table))
    batches = pa.table(dt.deletion_vectors()).to_pylist()
    root = str(table).rstrip("/") + "/"
    out = {}
    for row in batches:
        path = unquote(urlsplit(row["filepath"]).path)
        assert path.startswith(root), path
        out[path[len(root) :]] = {i for i, keep in enumerate(row["selection_vector"]) if not keep}
    return out


def _ours(table: Path | str, version: int) -> dict[str, set[int]]:
    url = str(table)
    descriptors = dv_log.deletion_vector_descriptors(url, None, version)
    return {path: set(read_deleted_rows(url, None, path, dv)) for path, dv in descriptors.items()}


def _log_actions(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _write_commit(table: Path, version: int, actions: list[dict[str, Any]]) -> None:
    with open(table / "_delta_log" / f"{version:020d}.json", "x") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


# --------------------------------------------------------------------------------------------
# Z85
# --------------------------------------------------------------------------------------------


def test_z85_known_vector_from_the_zeromq_spec() -> None:
    raw = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(raw) == "HelloWorld"
    assert z85_decode("HelloWorld") == raw


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_z85_round_trip(data: bytes) -> None:
    text = z85_encode(data)
    assert len(text) == len(data) // 4 * 5
    assert z85_decode(text) == data


def test_z85_refuses_unaligned_input_and_foreign_characters() -> None:
    with pytest.raises(ValueError):
        z85_encode(b"abc")
    with pytest.raises(ValueError):
        z85_decode("Hell")  # 4 characters: not a whole block
    with pytest.raises(ValueError):
        z85_decode("Hello;orld")  # ';' is RFC 1924 base85 but not Z85


def test_uuid_of_a_relative_dv_path() -> None:
    dv = DeletionVector("u", "vBn[lx{q8@P<9BNH/isA", 1, 36, 2)
    assert dv.relative_path() == "deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"
    # The protocol's example with a random prefix "ab".
    prefixed = DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 4, 40, 6)
    assert prefixed.relative_path() == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    absolute = DeletionVector("p", "s3://mytable/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin", 4, 40, 6)
    assert absolute.relative_path() == absolute.path_or_inline_dv
    assert DeletionVector("i", "0000000000", None, 8, 1).relative_path() is None


def test_descriptor_json_and_unique_id() -> None:
    on_disk = {"storageType": "u", "pathOrInlineDv": "vBn[lx{q8@P<9BNH/isA", "offset": 1, "sizeInBytes": 36,
               "cardinality": 2}
    dv = DeletionVector.from_json(on_disk)
    assert dv.to_json() == on_disk
    assert dv.unique_id == "uvBn[lx{q8@P<9BNH/isA@1"
    inline = {"storageType": "i", "pathOrInlineDv": "wi5b=", "sizeInBytes": 4, "cardinality": 1}
    assert "offset" not in DeletionVector.from_json(inline).to_json()
    assert DeletionVector.from_json({**inline, "offset": None}).unique_id == "iwi5b="
    with pytest.raises(ValueError):
        DeletionVector("x", "", None, 0, 0)


# --------------------------------------------------------------------------------------------
# RoaringBitmapArray
# --------------------------------------------------------------------------------------------

_ROWS = st.one_of(
    st.integers(0, 70_000),  # several 16-bit containers of the first bucket
    st.integers(2**32 - 5, 2**32 + 5),  # across the first bucket boundary
    st.integers(0, 2**63 - 1),  # anywhere a Delta key may be
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROWS, max_size=300), st.booleans())
def test_bitmap_round_trip(rows: list[int], with_a_run: bool) -> None:
    positions = BitMap64(rows)
    if with_a_run:
        positions.add_range(100_000, 105_000)  # a run container after run_optimize
    data = encode_bitmap(positions)
    assert decode_bitmap(data) == positions
    # The layout, bucket by bucket: what encode_bitmap leaves to CRoaring is exactly the
    # protocol's "number of buckets, then per bucket its key and a portable 32-bit bitmap".
    buckets: dict[int, BitMap] = {}
    for row in positions:
        buckets.setdefault(row >> 32, BitMap()).add(row & 0xFFFFFFFF)
    expected = struct.pack("<iq", MAGIC, len(buckets))
    for key in sorted(buckets):
        bucket = buckets[key]
        bucket.run_optimize()
        expected += struct.pack("<i", key) + bucket.serialize()
    assert data == expected


def test_bitmap_bytes_by_hand() -> None:
    data = encode_bitmap(BitMap64([3, 2**32 + 7]))
    assert data[:4] == bytes.fromhex("d1d33964")  # 1681511377, little endian
    assert struct.unpack_from("<q", data, 4) == (2,)  # two buckets
    assert struct.unpack_from("<i", data, 12) == (0,)  # first key
    first = BitMap([3]).serialize()
    # A portable 32-bit bitmap without runs: cookie 12346, one container, key 0, cardinality-1 0,
    # its offset (16), then the value as a 16-bit integer.
    assert first == struct.pack("<IIHHIH", 12346, 1, 0, 0, 16, 3)
    assert data[16 : 16 + len(first)] == first
    assert struct.unpack_from("<i", data, 16 + len(first)) == (1,)  # second key
    assert data[20 + len(first) :] == BitMap([7]).serialize()
    assert encode_bitmap(BitMap64()) == struct.pack("<iq", MAGIC, 0)


def test_bitmap_limits_and_damage() -> None:
    with pytest.raises(ValueError, match="2\\*\\*63"):
        encode_bitmap(BitMap64([2**63]))
    good = encode_bitmap(BitMap64([1, 2, 3]))
    with pytest.raises(ValueError, match="magic"):
        decode_bitmap(b"\0" + good[1:])
    with pytest.raises(ValueError):
        decode_bitmap(good[:-2])
    with pytest.raises(ValueError):
        decode_bitmap(good[:8])


def test_inline_dv_padding_as_delta_spark_writes_it() -> None:
    # An inline DV written by Delta Spark (a test table of Delta's): 38 bitmap bytes, padded with
    # two zero bytes to 40 before Z85, sizeInBytes keeping 38. Ours must produce the same text.
    text = "^Bg9^0rr910000000000iXQKl0rr91000625c8Xg0rri41POJ5"
    dv = DeletionVector("i", text, None, 38, 3)
    assert read_deleted_rows("/nowhere", None, "f.parquet", dv) == BitMap64([1, 3, 5])
    assert len(encode_bitmap(BitMap64([1, 3, 5]))) == 38
    assert dvs._encode_inline(encode_bitmap(BitMap64([1, 3, 5]))) == text


def test_the_protocol_inline_example_is_refused() -> None:
    # PROTOCOL.md's "JSON Example 3" decodes to a big-endian native layout (magic 1681511376),
    # not the portable RoaringBitmapArray it describes; Delta Spark and Trino refuse it too.
    dv = DeletionVector("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", None, 40, 6)
    with pytest.raises(DeltaTableError, match="magic"):
        read_deleted_rows("/nowhere", None, "f.parquet", dv)


# --------------------------------------------------------------------------------------------
# DV files
# --------------------------------------------------------------------------------------------


def test_dv_file_layout() -> None:
    a, b = encode_bitmap(BitMap64([0, 9])), encode_bitmap(BitMap64([5]))
    content, locations = serialize_dv_file([a, b])
    assert content[0] == 1
    assert locations == [(1, len(a)), (1 + 4 + len(a) + 4, len(b))]
    for (offset, size), data in zip(locations, [a, b], strict=True):
        assert struct.unpack_from(">i", content, offset) == (size,)
        assert struct.unpack_from(">I", content, offset + 4 + size) == (zlib.crc32(data),)
        assert parse_dv_file_entry(content[offset : offset + 4 + size + 4], size) == data
    assert len(content) == locations[-1][0] + 4 + len(b) + 4


@pytest.mark.parametrize("table", [SMALL, LARGE], ids=["small", "large"])
def test_fixture_files_parse_at_the_logged_offsets(table: Path) -> None:
    """Delta Spark's offsets point at the size field (the first DV of a file is at 1)."""
    seen = 0
    for version in range(len(list((table / "_delta_log").glob("*.json")))):
        for action in _log_actions(table, version):
            descriptor = (action.get("add") or {}).get("deletionVector")
            if descriptor is None:
                continue
            dv = DeletionVector.from_json(descriptor)
            content = (table / dv.relative_path()).read_bytes()
            assert content[0] == 1
            entry = content[dv.offset : dv.offset + 4 + dv.size_in_bytes + 4]
            assert len(decode_bitmap(parse_dv_file_entry(entry, dv.size_in_bytes))) == dv.cardinality
            seen += 1
    assert seen


@pytest.mark.parametrize("table", [SMALL, LARGE], ids=["small", "large"])
def test_fixture_tables_at_every_version_match_delta_rs(table: Path) -> None:
    versions = len(list((table / "_delta_log").glob("*.json")))
    for version in range(versions):
        expected = _rs_deleted(table, version)
        assert _ours(table, version) == expected, version
        # A file:// URL for the same table gives the same answer.
        assert _ours(f"file://{table}", version) == expected
    assert any(_rs_deleted(table, v) for v in range(versions))
    with pytest.raises(DeltaTableError, match=f"version {versions}"):
        dv_log.deletion_vector_descriptors(str(table), None, versions)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def test_write_and_read_back_with_one_inline(tmp_path: Path) -> None:
    table = _copy_table(SMALL, tmp_path / "t")
    small = BitMap64([1])
    big = BitMap64(range(0, 200_000, 3))
    wide = BitMap64([7, 2**32 + 1, 2**40])
    limit = len(encode_bitmap(small))
    written = write_deletion_vectors(str(table), None, [big, small, wide], inline_max_bytes=limit)
    kinds = [dv.storage_type for dv in written.descriptors]
    assert kinds == ["u", "i", "u"]
    assert written.file is not None and written.file.startswith("deletion_vector_")
    assert (table / written.file).exists()
    on_disk = written.descriptors[0]
    assert on_disk.relative_path() == written.file
    assert on_disk.offset == 1 and written.descriptors[2].offset == 1 + 4 + on_disk.size_in_bytes + 4
    assert written.descriptors[1].offset is None
    for dv, bitmap in zip(written.descriptors, [big, small, wide], strict=True):
        assert dv.cardinality == len(bitmap)
        assert dv.size_in_bytes == len(encode_bitmap(bitmap))
        assert read_deleted_rows(f"file://{table}", None, "any.parquet", dv) == bitmap

    # The same entry named by an absolute path ('p'), inside the table and elsewhere.
    elsewhere = tmp_path / "other place"
    elsewhere.mkdir()
    shutil.copy(table / written.file, elsewhere / written.file)
    for url in (f"file://{table}/{written.file}", f"file://{elsewhere}/{written.file}".replace(" ", "%20")):
        absolute = DeletionVector("p", url, on_disk.offset, on_disk.size_in_bytes, on_disk.cardinality)
        assert read_deleted_rows(f"file://{table}", None, "any.parquet", absolute) == big

    only_inline = write_deletion_vectors(str(table), None, [small], inline_max_bytes=1 << 20)
    assert only_inline.file is None and only_inline.descriptors[0].storage_type == "i"
    with pytest.raises(ValueError, match="empty"):
        write_deletion_vectors(str(table), None, [BitMap64()])

    delete_dv_file(str(table), None, written.file)
    assert not (table / written.file).exists()
    delete_dv_file(str(table), None, written.file)  # twice is fine


def test_damaged_and_missing_dv_files(tmp_path: Path) -> None:
    table = _copy_table(SMALL, tmp_path / "t")
    written = write_deletion_vectors(str(table), None, [BitMap64([2, 4, 6])])
    dv = written.descriptors[0]
    path = table / written.file
    content = bytearray(path.read_bytes())

    content[dv.offset + 4 + 5] ^= 0x01  # a bit of the bitmap: the CRC no longer matches
    path.write_bytes(bytes(content))
    with pytest.raises(DeltaTableError) as err:
        read_deleted_rows(str(table), None, "data/part-1.parquet", dv)
    assert "CRC" in str(err.value) and "data/part-1.parquet" in str(err.value) and written.file in str(err.value)
    content[dv.offset + 4 + 5] ^= 0x01

    content[dv.offset + 3] ^= 0x01  # the size field
    path.write_bytes(bytes(content))
    with pytest.raises(DeltaTableError, match="bytes, the log says"):
        read_deleted_rows(str(table), None, "data/part-1.parquet", dv)
    content[dv.offset + 3] ^= 0x01
    path.write_bytes(bytes(content))

    wrong_cardinality = DeletionVector(dv.storage_type, dv.path_or_inline_dv, dv.offset, dv.size_in_bytes, 4)
    with pytest.raises(DeltaTableError, match="cardinality 4"):
        read_deleted_rows(str(table), None, "data/part-1.parquet", wrong_cardinality)

    path.write_bytes(bytes(content[: dv.offset + 10]))  # cut short
    with pytest.raises(DeltaTableError, match="ends early"):
        read_deleted_rows(str(table), None, "data/part-1.parquet", dv)

    path.unlink()
    with pytest.raises(DeltaTableError) as err:
        read_deleted_rows(str(table), None, "data/part-1.parquet", dv)
    message = str(err.value)
    assert "does not exist" in message and "data/part-1.parquet" in message and written.file in message
    assert str(table) in message


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every object-store read of a DV file, as (path, ranges), through obstore's functions."""
    calls: list[tuple[str, int]] = []
    get_ranges, get_range = dvs.obstore.get_ranges, dvs.obstore.get_range

    def counted_ranges(store: Any, path: str, **kwargs: Any) -> Any:
        calls.append((path, len(kwargs["starts"])))
        return get_ranges(store, path, **kwargs)

    def counted_range(store: Any, path: str, **kwargs: Any) -> Any:
        calls.append((path, 1))
        return get_range(store, path, **kwargs)

    monkeypatch.setattr(dvs.obstore, "get_ranges", counted_ranges)
    monkeypatch.setattr(dvs.obstore, "get_range", counted_range)
    return calls


def test_many_vectors_are_read_with_one_request_per_dv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _copy_table(SMALL, tmp_path / "t")
    first = [BitMap64(range(i, 50_000, 7 + i)) for i in range(3)]
    second = [BitMap64([5, 9]), BitMap64(range(0, 90_000, 2))]
    one = write_deletion_vectors(str(table), None, first)
    two = write_deletion_vectors(str(table), None, second, inline_max_bytes=len(encode_bitmap(second[0])))
    assert [d.storage_type for d in two.descriptors] == ["i", "u"]
    # interleaved across the two files, and each file's entries out of order
    order = [(one, 2), (two, 1), (one, 0), (two, 0), (one, 1)]
    vectors = [(f"data/part-{n}.parquet", written.descriptors[i]) for n, (written, i) in enumerate(order)]
    expected = [(first if written is one else second)[i] for written, i in order]
    calls = _counting_reads(monkeypatch)
    assert dvs.read_deleted_rows_of(str(table), None, vectors) == expected
    assert sorted(calls) == sorted([(one.file, 3), (two.file, 1)])  # the inline one reads nothing

    # a missing DV file is named with a data file whose vector lives in it
    (table / str(two.file)).unlink()
    with pytest.raises(DeltaTableError) as err:
        dvs.read_deleted_rows_of(str(table), None, vectors)
    assert "does not exist" in str(err.value) and "data/part-1.parquet" in str(err.value)
    assert str(two.file) in str(err.value)


def test_positions_of_vectors_this_process_wrote_are_not_read_back(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from streaming_merge.table import dv_positions
    from streaming_merge.table.snapshot import DataFile

    table = _copy_table(SMALL, tmp_path / "t")
    url = f"file://{table}"
    bitmaps = [BitMap64(range(3, 30_000, 11)), BitMap64([1, 2, 3])]
    written = write_deletion_vectors(url, None, bitmaps)
    files = [DataFile(path=f"part-{i}.parquet", size=100 + i, num_records=40_000, partition_values={},
                      deletion_vector=d) for i, d in enumerate(written.descriptors)]
    snapshot: Any = SimpleNamespace(location=SimpleNamespace(log_uri=url, options=None))
    calls = _counting_reads(monkeypatch)
    # not remembered: read, in one request for the one DV file, then kept
    read = dv_positions.deleted_positions_of(snapshot, files)
    assert [list(r) for r in read] == [list(b) for b in bitmaps] and len(calls) == 1
    assert [list(r) for r in dv_positions.deleted_positions_of(snapshot, files)] == [list(b) for b in bitmaps]
    assert len(calls) == 1
    # a vector remembered as it is committed is never read
    newer = write_deletion_vectors(url, None, [BitMap64([4, 8, 15])])
    dv_positions.remember(url, [("part-0.parquet", newer.descriptors[0], BitMap64([4, 8, 15]))])
    changed = DataFile(path="part-0.parquet", size=100, num_records=40_000, partition_values={},
                       deletion_vector=newer.descriptors[0])
    assert list(dv_positions.deleted_positions(snapshot, changed)) == [4, 8, 15] and len(calls) == 1


# --------------------------------------------------------------------------------------------
# What delta-rs reads of ours
# --------------------------------------------------------------------------------------------


def _commit_new_dv(
    table: Path, positions: BitMap64, inline_max_bytes: int = 0
) -> tuple[DeletionVector, DeletionVector]:
    """Version 2 of a copy of table-with-dv-small: its file gets a new DV (remove of the old
    logical file, add of the new one), as our MERGE commits it. Returns (old, new)."""
    add = next(a["add"] for a in _log_actions(table, 1) if "add" in a)
    old = DeletionVector.from_json(add["deletionVector"])
    new = write_deletion_vectors(str(table), None, [positions], inline_max_bytes=inline_max_bytes).descriptors[0]
    remove = {
        "path": add["path"], "deletionTimestamp": 1700000000000, "dataChange": True, "extendedFileMetadata": True,
        "partitionValues": add["partitionValues"], "size": add["size"], "tags": add["tags"],
        "deletionVector": old.to_json(),
    }
    commit_info = {"commitInfo": {"timestamp": 1700000000000, "operation": "DELETE", "readVersion": 1}}
    # The add first, then the remove of the old logical file: the order within a commit is free.
    _write_commit(table, 2, [commit_info, {"add": {**add, "deletionVector": new.to_json()}}, {"remove": remove}])
    return old, new


@pytest.mark.parametrize("inline", [False, True], ids=["on-disk", "inline"])
def test_delta_rs_reads_what_we_write(tmp_path: Path, inline: bool) -> None:
    table = _copy_table(SMALL, tmp_path / "t")
    assert _ours(table, 1) == {SMALL_FILE: {0, 9}}  # cached at version 1 before the commit
    positions = BitMap64([0, 3, 4, 9])  # a superset of the existing deletions
    old, new = _commit_new_dv(table, positions, inline_max_bytes=1 << 20 if inline else 0)
    assert new.storage_type == ("i" if inline else "u")

    assert _rs_deleted(table) == {SMALL_FILE: {0, 3, 4, 9}}
    values = pa.table(DeltaTable(str(table)).scan()).column("value").to_pylist()
    assert sorted(values) == [1, 2, 5, 6, 7, 8]

    assert dv_log.deletion_vector_descriptors(str(table), None, 2) == {SMALL_FILE: new}
    assert dv_log.deletion_vector_descriptors(str(table), None, 1) == {SMALL_FILE: old}
    assert _ours(table, 2) == {SMALL_FILE: {0, 3, 4, 9}}


def test_descriptors_from_a_delta_rs_checkpoint(tmp_path: Path) -> None:
    table = _copy_table(SMALL, tmp_path / "t")
    _, new = _commit_new_dv(table, BitMap64([0, 1, 9]))
    DeltaTable(str(table)).create_checkpoint()
    log = table / "_delta_log"
    assert (log / f"{2:020d}.checkpoint.parquet").exists()
    # Without the earlier commits only the checkpoint can answer.
    (log / f"{0:020d}.json").unlink()
    (log / f"{1:020d}.json").unlink()
    assert dv_log.deletion_vector_descriptors(str(table), None, 2) == {SMALL_FILE: new}
    assert _ours(table, 2) == _rs_deleted(table) == {SMALL_FILE: {0, 1, 9}}
    with pytest.raises(DeltaTableError, match="version 1"):
        dv_log.deletion_vector_descriptors(str(table), None, 1)

    # The same checkpoint as two parts, without _last_checkpoint: found by listing.
    dv_log.clear_cache()
    checkpoint = pq.read_table(log / f"{2:020d}.checkpoint.parquet")
    half = checkpoint.num_rows // 2
    (log / f"{2:020d}.checkpoint.parquet").unlink()
    (log / "_last_checkpoint").unlink()
    pq.write_table(checkpoint.slice(0, half), log / f"{2:020d}.checkpoint.0000000001.0000000002.parquet")
    pq.write_table(checkpoint.slice(half), log / f"{2:020d}.checkpoint.0000000002.0000000002.parquet")
    assert dv_log.deletion_vector_descriptors(str(table), None, 2) == {SMALL_FILE: new}

    # With a part missing, the checkpoint does not count, and the cleaned-up log cannot replay.
    dv_log.clear_cache()
    (log / f"{2:020d}.checkpoint.0000000001.0000000002.parquet").unlink()
    with pytest.raises(DeltaTableError, match="no complete checkpoint"):
        dv_log.deletion_vector_descriptors(str(table), None, 2)


# --------------------------------------------------------------------------------------------
# Replay rules and the cache
# --------------------------------------------------------------------------------------------


def _dv(n: int) -> dict[str, Any]:
    return {"storageType": "u", "pathOrInlineDv": "vBn[lx{q8@P<9BNH/isA", "offset": n, "sizeInBytes": 36,
            "cardinality": 2}


def test_reconciliation_by_path_and_dv_id(tmp_path: Path) -> None:
    """Only the log matters here, so the table is a bare ``_delta_log``."""
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)

    def add(path: str, dv: dict[str, Any] | None) -> dict[str, Any]:
        return {"add": {"path": path, "deletionVector": dv}}

    def remove(path: str, dv: dict[str, Any] | None) -> dict[str, Any]:
        return {"remove": {"path": path, "deletionVector": dv}}

    _write_commit(table, 0, [{"protocol": {}}, add("a", None), add("b%20c", _dv(1)), add("d", _dv(1))])
    _write_commit(table, 1, [add("a", _dv(2)), remove("a", None),  # add before remove
                             remove("b%20c", _dv(1)), add("b%20c", _dv(3)),  # remove before add
                             remove("d", _dv(9))])  # not d's live DV: no effect
    _write_commit(table, 2, [remove("d", _dv(1)), add("a", None)])  # d gone; a loses its DV
    url = str(table)
    by_version = [dv_log.deletion_vector_descriptors(url, None, v) for v in range(3)]
    assert {k: v.offset for k, v in by_version[0].items()} == {"b c": 1, "d": 1}
    assert {k: v.offset for k, v in by_version[1].items()} == {"a": 2, "b c": 3, "d": 1}
    assert {k: v.offset for k, v in by_version[2].items()} == {"b c": 3}
    dv_log.clear_cache()  # the same from a cold start (a full replay, not the incremental path)
    assert dv_log.deletion_vector_descriptors(url, None, 2) == by_version[2]


def test_a_newer_version_applies_only_the_newer_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _copy_table(LARGE, tmp_path / "t")
    url = str(table)
    first = dv_log.deletion_vector_descriptors(url, None, 1)

    def no_listing(*args: object) -> None:
        raise AssertionError("a cached older version must be advanced, not replayed from a listing")

    monkeypatch.setattr(dv_log, "list_log", no_listing)
    assert dv_log.deletion_vector_descriptors(url, None, 3) == dv_log.deletion_vector_descriptors(url, None, 4)
    assert len(dv_log.deletion_vector_descriptors(url, None, 4)) == 8
    first.clear()  # callers get copies: the cache is not theirs to change
    assert len(dv_log.deletion_vector_descriptors(url, None, 1)) == 5
    monkeypatch.undo()
    with pytest.raises(DeltaTableError, match="version 5"):  # advancing fails over to the replay's error
        dv_log.deletion_vector_descriptors(url, None, 5)


def test_a_log_restored_from_a_copy_is_replayed_not_answered_from_the_cache(tmp_path: Path) -> None:
    """A table put back from a backup at the same place keeps its id and its version numbers;
    a history written after the backup must not answer for the one written after the restore."""
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)
    _write_commit(table, 0, [{"protocol": {}}, {"add": {"path": "a", "deletionVector": _dv(1)}}])
    backup = tmp_path / "backup"
    shutil.copytree(table, backup)
    _write_commit(table, 1, [{"add": {"path": "b", "deletionVector": _dv(2)}}])
    _write_commit(table, 2, [{"add": {"path": "c", "deletionVector": _dv(3)}}])
    url = str(table)
    assert set(dv_log.deletion_vector_descriptors(url, None, 2)) == {"a", "b", "c"}

    shutil.rmtree(table)
    shutil.copytree(backup, table)
    _write_commit(table, 1, [{"add": {"path": "d", "deletionVector": _dv(4)}}])
    assert set(dv_log.deletion_vector_descriptors(url, None, 1)) == {"a", "d"}  # exact version cached before
    _write_commit(table, 2, [{"remove": {"path": "a", "deletionVector": _dv(1)}}])
    assert set(dv_log.deletion_vector_descriptors(url, None, 2)) == {"d"}


def test_store_options_in_delta_rs_spelling() -> None:
    """delta-rs options obstore spells differently (client options with a store prefix) or
    does not know (delta-rs' own) must not break the store; building it touches no network."""
    store = store_module._build_store("s3a://bucket/lake/t", {
        "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_ENDPOINT_URL": "http://localhost:9000",
        "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    })
    assert store.prefix == "lake/t"
    assert store.config["endpoint"] == "http://localhost:9000"
    assert store.client_options == {"allow_http": "true"}
    with pytest.raises(DeltaTableError, match="hdfs://nn/t"):
        store_module.table_store("hdfs://nn/t", None)
