"""MergeSink's options in a few groups, each a frozen dataclass, beside its flat keywords.

``MergeSink`` takes every option as a keyword of its own under AUTO CDC's names (that is the
call Spark's and Databricks' documentation shows, and ``create_auto_cdc_flow`` passes them
through), which makes a long signature. The groups give the same options a shape: a flow's
CDC semantics can be built once and shared by its flows, and a reader finds what belongs
together in one place. Each field has the name and default of its keyword, so the two forms
are one: a group not given is built from the keywords, and a group given with one of its
keywords set as well is refused (which of the two was meant cannot be told). Validation stays
with the sink, so both forms fail with the same messages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.merge.materialize import DEFAULT_STORAGE_LEVELS
from streaming_merge.merge.options import MergeOptions
from streaming_merge.streaming.arguments import ColumnArg, ScdType
from streaming_merge.streaming.cdc import Dedupe
from streaming_merge.streaming.compaction import AutoCompact
from streaming_merge.streaming.retries import DEFAULT_CONFLICT_BACKOFF, DEFAULT_MAX_CONFLICT_RETRIES

PhaseHook = Callable[[str, DataFrame], None]


@dataclasses.dataclass(frozen=True)
class TableOptions:
    """The tables the sink writes besides its MERGE: how it creates a missing target, whether
    new batch columns reach it, the dead letter table, and delta-rs's storage options."""

    create_if_missing: bool = True
    partition_by: Sequence[str] | None = None
    table_properties: Mapping[str, str] | None = None
    schema_evolution: bool = False
    dead_letter: str | None = None
    storage_options: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class CdcOptions:
    """How change events apply, under AUTO CDC's names: their order, deletes and truncates,
    the SCD type and its history columns, the column selection, partial updates, and the
    tombstones that keep a late event from undoing a delete."""

    sequence_by: ColumnArg | Sequence[ColumnArg] | None = None
    apply_as_deletes: str | Column | None = None
    apply_as_truncates: str | Column | None = None
    stored_as_scd_type: ScdType | None = None
    dedupe: Dedupe = "last"
    column_list: Sequence[ColumnArg] | None = None
    except_column_list: Sequence[ColumnArg] | None = None
    ignore_null_updates: bool = False
    ignore_null_updates_column_list: Sequence[ColumnArg] | None = None
    ignore_null_updates_except_column_list: Sequence[ColumnArg] | None = None
    unavailable_value: str | None = None
    track_history_column_list: Sequence[ColumnArg] | None = None
    track_history_except_column_list: Sequence[ColumnArg] | None = None
    tombstones: bool | str = True
    tombstone_retention: dt.timedelta = dt.timedelta(days=7)
    tombstone_purge_every: int = 100


@dataclasses.dataclass(frozen=True)
class RetryOptions:
    """How a batch is rerun: after its materialized blocks were lost (``max_attempts``, each
    attempt at the next of ``storage_levels``) and after a conflicting commit."""

    max_attempts: int = 4
    storage_levels: Sequence[str] = DEFAULT_STORAGE_LEVELS
    max_conflict_retries: int = DEFAULT_MAX_CONFLICT_RETRIES
    conflict_backoff: tuple[float, float] = DEFAULT_CONFLICT_BACKOFF


@dataclasses.dataclass(frozen=True)
class ProgressOptions:
    """What the sink keeps and tells about its batches."""

    progress_capacity: int = 100
    phase_hook: PhaseHook | None = None


@dataclasses.dataclass(frozen=True)
class PerformanceOptions:
    """The MERGE's own options and the compaction after it."""

    merge_options: MergeOptions | None = None
    auto_compact: AutoCompact | None = None


GROUPS: Mapping[str, type] = {"table": TableOptions, "cdc": CdcOptions, "retries": RetryOptions,
                              "progress": ProgressOptions, "performance": PerformanceOptions}
_Group = TypeVar("_Group")


def grouped(cls: type[_Group], parameter: str, given: _Group | None, keywords: Mapping[str, Any]) -> _Group:
    """The group ``given`` as ``parameter=``, or built from the sink's flat ``keywords`` (every
    argument of the call, by name). Refused: a given group with one of its keywords set too, and
    ``parameter=`` something other than the group."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if given is None:
        return cls(**{name: keywords[name] for name in names})
    if not isinstance(given, cls):
        raise InvalidArgumentError(f"{parameter} takes a {cls.__name__}(...), got {type(given).__name__} {given!r}")
    defaults = cls()
    also = [name for name in names if not _is_default(keywords[name], getattr(defaults, name))]
    if also:
        raise InvalidArgumentError(
            f"Pass {also[0]}=... on its own or inside {parameter}={cls.__name__}(...), not both: which one was meant "
            "cannot be told.")
    return given


def _is_default(value: Any, default: Any) -> bool:
    if value is default or default is None or isinstance(value, Column):  # a Column's == is an expression
        return value is default
    return type(value) is type(default) and value == default
