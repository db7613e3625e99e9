"""streaming_merge: Delta Lake MERGE on PySpark, and a streaming upsert sink built on it.

Public API only; everything else is internal and may change.

The names are imported on first use (PEP 562): Spark's Python workers import
``streaming_merge.kafka.source`` for the Kafka source, and every fresh worker process
(the streaming source's planner, each executor worker) would otherwise also import the MERGE
engine, delta-rs and the sink, 0.2-0.3 s of each one's start that a micro-batch waits for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streaming_merge import errors
    from streaming_merge.delta_table import DeltaTable
    from streaming_merge.dml import DmlMetrics
    from streaming_merge.merge.builder import DeltaMergeBuilder
    from streaming_merge.merge.metrics import MergeMetrics
    from streaming_merge.merge.options import MergeOptions
    from streaming_merge.optimize.builder import DeltaOptimizeBuilder
    from streaming_merge.optimize.metrics import OptimizeMetrics
    from streaming_merge.optimize.options import OptimizeOptions
    from streaming_merge.snapshots.flow import create_auto_cdc_from_snapshot_flow
    from streaming_merge.streaming.auto_cdc import create_auto_cdc_flow
    from streaming_merge.streaming.compaction import AutoCompact
    from streaming_merge.streaming.progress import MergeProgress, MergeProgressListener
    from streaming_merge.streaming.sink import MergeSink
    from streaming_merge.streaming.sink_options import (
        CdcOptions,
        PerformanceOptions,
        ProgressOptions,
        RetryOptions,
        TableOptions,
    )

_HOMES = {
    "AutoCompact": "streaming_merge.streaming.compaction",
    "CdcOptions": "streaming_merge.streaming.sink_options",
    "DeltaMergeBuilder": "streaming_merge.merge.builder",
    "DeltaOptimizeBuilder": "streaming_merge.optimize.builder",
    "DeltaTable": "streaming_merge.delta_table",
    "DmlMetrics": "streaming_merge.dml",
    "MergeMetrics": "streaming_merge.merge.metrics",
    "MergeOptions": "streaming_merge.merge.options",
    "MergeProgress": "streaming_merge.streaming.progress",
    "MergeProgressListener": "streaming_merge.streaming.progress",
    "MergeSink": "streaming_merge.streaming.sink",
    "OptimizeMetrics": "streaming_merge.optimize.metrics",
    "OptimizeOptions": "streaming_merge.optimize.options",
    "PerformanceOptions": "streaming_merge.streaming.sink_options",
    "ProgressOptions": "streaming_merge.streaming.sink_options",
    "RetryOptions": "streaming_merge.streaming.sink_options",
    "TableOptions": "streaming_merge.streaming.sink_options",
    "create_auto_cdc_flow": "streaming_merge.streaming.auto_cdc",
    "create_auto_cdc_from_snapshot_flow": "streaming_merge.snapshots.flow",
}

__all__ = [
    "AutoCompact",
    "CdcOptions",
    "DeltaMergeBuilder",
    "DeltaOptimizeBuilder",
    "DeltaTable",
    "DmlMetrics",
    "MergeMetrics",
    "MergeOptions",
    "MergeProgress",
    "MergeProgressListener",
    "MergeSink",
    "OptimizeMetrics",
    "OptimizeOptions",
    "PerformanceOptions",
    "ProgressOptions",
    "RetryOptions",
    "TableOptions",
    "create_auto_cdc_flow",
    "create_auto_cdc_from_snapshot_flow",
    "errors",
]


def __getattr__(name: str) -> Any:
    if name == "errors":
        value: Any = importlib.import_module("streaming_merge.errors")
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'streaming_merge' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
