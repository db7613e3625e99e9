"""MergeSink's arguments under AUTO CDC's names, without Spark: the deprecated aliases
(``delete_when``, ``scd_type``) and their errors, ``stored_as_scd_type``'s forms, the
ignore-null options as alternatives, and the refusals that come before any batch."""

from __future__ import annotations

import warnings

import pytest

from streaming_merge import MergeSink
from streaming_merge.streaming import arguments
from streaming_merge.streaming.auto_cdc import _trigger


@pytest.fixture()
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deprecations warn once per process: forget the ones already given."""
    monkeypatch.setattr(arguments, "_WARNED", set())


def test_deprecated_names_still_work_and_warn_once(fresh_warnings: None, tmp_path: object) -> None:
    with pytest.warns(DeprecationWarning, match=r"delete_when=\.\.\.\) is deprecated; use apply_as_deletes") as seen:
        sink = MergeSink(str(tmp_path), keys="id", sequence_by="lsn", delete_when="op = 'd'", scd_type=2)
    assert sorted(str(w.message).split("(")[1].split("=")[0] for w in seen) == ["delete_when", "scd_type"]
    assert seen[0].filename == __file__  # points at the caller
    assert sink._spec is not None and sink._spec.delete_when == "op = 'd'" and sink._scd_type == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use in the same process is quiet
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", delete_when="op = 'd'", scd_type=1)


@pytest.mark.parametrize(("old", "new"), [({"delete_when": "op = 'd'"}, {"apply_as_deletes": "op = 'x'"}),
                                          ({"scd_type": 1}, {"stored_as_scd_type": 2})])
def test_an_old_and_a_new_name_together_is_an_error(fresh_warnings: None, tmp_path: object,
                                                    old: dict[str, object], new: dict[str, object]) -> None:
    (new_name,), (old_name,) = new, old
    with pytest.raises(ValueError, match=rf"Pass {new_name}=\.\.\. only: {old_name}=\.\.\. is its deprecated alias"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", **old, **new)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1, 2, "1", "2"])
def test_stored_as_scd_type_takes_spark_forms(tmp_path: object, value: object) -> None:
    sink = MergeSink(str(tmp_path), keys="id", sequence_by="lsn", stored_as_scd_type=value)  # type: ignore[arg-type]
    assert sink._scd_type == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [0, 3, "3", True, 1.5, "SCD TYPE 2"])
def test_stored_as_scd_type_refuses_other_values(tmp_path: object, value: object) -> None:
    with pytest.raises(ValueError, match=r"stored_as_scd_type must be 1 or 2 \(or '1' / '2'\)"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", stored_as_scd_type=value)  # type: ignore[arg-type]


def test_ignore_null_options_are_alternatives(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="ignore_null_updates=True / ignore_null_updates_column_list"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", ignore_null_updates=True,
                  ignore_null_updates_column_list=["name"])
    with pytest.raises(ValueError, match="ignore_null_updates_column_list / ignore_null_updates_except_column_list"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", ignore_null_updates_column_list=["name"],
                  ignore_null_updates_except_column_list=["op"])
    # an empty list is no selection (Spark's API cannot tell it from an omitted one)
    sink = MergeSink(str(tmp_path), keys="id", sequence_by="lsn", ignore_null_updates_column_list=[],
                     column_list=[], stored_as_scd_type=2, track_history_column_list=[])
    assert sink._spec is not None and not sink._spec.partial and not sink._selection.active
    assert sink._track.include is None
    with pytest.raises(ValueError, match="must be a list of column names or Columns"):
        MergeSink(str(tmp_path), keys="id", ignore_null_updates_column_list="name")  # type: ignore[arg-type]


def test_scd2_now_takes_partial_updates_and_refuses_what_it_cannot_do(tmp_path: object) -> None:
    sink = MergeSink(str(tmp_path), keys="id", sequence_by="lsn", stored_as_scd_type=2,
                     ignore_null_updates_except_column_list=["op"], unavailable_value="__x")
    assert sink._spec is not None and sink._spec.partial and sink._spec.keep_all_events
    with pytest.raises(ValueError, match="stored_as_scd_type=2 cannot be combined with schema_evolution"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", stored_as_scd_type=2, schema_evolution=True)


def test_custom_clauses_refuse_a_selection_without_the_sequence(tmp_path: object) -> None:
    with pytest.raises(ValueError, match=r"leave the sequence_by column\(s\) \['lsn'\] out of the table"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", except_column_list=["LSN"],
                  clauses=lambda builder: builder)
    with pytest.raises(ValueError, match=r"\['lsn'\] out of the table"):
        MergeSink(str(tmp_path), keys="id", sequence_by="lsn", column_list=["name"], clauses=lambda builder: builder)


def test_keys_and_lists_refuse_what_is_not_a_column_name(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="keys takes column names"):
        MergeSink(str(tmp_path), keys=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="keys: a column name cannot be empty"):
        MergeSink(str(tmp_path), keys="")


@pytest.mark.parametrize(("trigger", "expected"), [({"availableNow": True}, {"availableNow": True}),
                                                  ({"processingTime": "10 seconds"}, {"processingTime": "10 seconds"})])
def test_triggers_are_spark_triggers(trigger: dict[str, object], expected: dict[str, object]) -> None:
    assert _trigger(trigger) == expected


@pytest.mark.parametrize("trigger", [{"continuous": "1 second"}, {}, {"once": True, "availableNow": True}])
def test_other_triggers_are_refused(trigger: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="foreachBatch has no continuous mode"):
        _trigger(trigger)
