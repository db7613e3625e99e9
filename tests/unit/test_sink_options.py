"""MergeSink's option groups (TableOptions, CdcOptions, ...) and its flat keywords are one API:
a sink built either way holds the same settings, validation fails with the same messages, and a
group given together with one of its keywords is refused."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect

import pytest

import streaming_merge as sm
from streaming_merge import CdcOptions, MergeSink, PerformanceOptions, ProgressOptions, RetryOptions, TableOptions
from streaming_merge.errors import InvalidArgumentError
from streaming_merge.streaming.sink_options import GROUPS


def _settings(sink: MergeSink) -> tuple[object, ...]:
    return (sink._spec, sink._scd_type, sink._track, sink._selection.leaves_out(["lsn"]), sink._tombstone_settings,
            sink._max_attempts, sink._max_conflict_retries, sink._conflict_backoff, sink._storage_levels,
            sink._dead_letter_ref, sink._create_if_missing, sink._partition_by, sink._table_properties,
            sink._schema_evolution, sink._merge_options, sink._auto_compact, sink._progress._records.maxlen)


def test_groups_and_keywords_build_the_same_sink(tmp_path: object) -> None:
    flat = MergeSink(str(tmp_path), keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'", stored_as_scd_type=2,
                     except_column_list=["op"], track_history_except_column_list=["ts"],
                     tombstone_retention=dt.timedelta(days=2), max_conflict_retries=3, conflict_backoff=(0.5, 1.0),
                     dead_letter=f"{tmp_path}_dead", partition_by=["day"], progress_capacity=7,
                     merge_options=sm.MergeOptions(broadcast_scan_min_bytes=1))
    grouped = MergeSink(
        str(tmp_path), keys="id",
        cdc=CdcOptions(sequence_by="lsn", apply_as_deletes="op = 'd'", stored_as_scd_type=2, except_column_list=["op"],
                       track_history_except_column_list=["ts"], tombstone_retention=dt.timedelta(days=2)),
        retries=RetryOptions(max_conflict_retries=3, conflict_backoff=(0.5, 1.0)),
        table=TableOptions(dead_letter=f"{tmp_path}_dead", partition_by=["day"]),
        progress=ProgressOptions(progress_capacity=7),
        performance=PerformanceOptions(merge_options=sm.MergeOptions(broadcast_scan_min_bytes=1)))
    assert _settings(flat) == _settings(grouped)
    assert flat.recentProgress == grouped.recentProgress == []


def test_every_keyword_is_in_one_group_with_its_default() -> None:
    parameters = inspect.signature(MergeSink.__init__).parameters
    seen: list[str] = []
    for parameter, cls in GROUPS.items():
        assert parameters[parameter].default is None
        for field in dataclasses.fields(cls):
            assert parameters[field.name].default == field.default, field.name
            seen.append(field.name)
    assert len(seen) == len(set(seen))
    ungrouped = set(parameters) - set(seen) - set(GROUPS)
    assert ungrouped == {"self", "target", "keys", "condition", "clauses", "app_id", "delete_when", "scd_type"}


def test_a_group_and_one_of_its_keywords_together_are_refused(tmp_path: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"Pass sequence_by=\.\.\. on its own or inside cdc=CdcOptions"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", cdc=CdcOptions(sequence_by="lsn"))
    with pytest.raises(InvalidArgumentError, match=r"max_attempts=\.\.\. on its own or inside retries=RetryOptions"):
        MergeSink(str(tmp_path), keys="id", max_attempts=2, retries=RetryOptions())
    # a keyword at its default is no conflict: it says nothing
    MergeSink(str(tmp_path), keys="id", max_attempts=4, retries=RetryOptions(max_attempts=2))


def test_a_group_of_the_wrong_class_is_refused(tmp_path: object) -> None:
    with pytest.raises(InvalidArgumentError, match="cdc takes a CdcOptions"):
        MergeSink(str(tmp_path), keys="id", cdc=TableOptions())  # type: ignore[arg-type]


def test_validation_is_the_same_in_groups(tmp_path: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"stored_as_scd_type must be 1 or 2"):
        MergeSink(str(tmp_path), keys="id", cdc=CdcOptions(sequence_by="lsn", stored_as_scd_type=3))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_attempts must be >= 1"):
        MergeSink(str(tmp_path), keys="id", retries=RetryOptions(max_attempts=0))
    with pytest.raises(InvalidArgumentError, match="cannot go with schema_evolution"):
        MergeSink(str(tmp_path), keys="id", cdc=CdcOptions(ignore_null_updates=True),
                  table=TableOptions(schema_evolution=True))


def test_groups_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CdcOptions().dedupe = "error"  # type: ignore[misc]
