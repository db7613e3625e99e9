"""streaming_merge: Delta Lake MERGE on PySpark, and a streaming upsert sink built on it.

Public API only; everything else is internal and may change.
"""

from streaming_merge import errors
from streaming_merge.delta_table import DeltaTable
from streaming_merge.merge.builder import DeltaMergeBuilder
from streaming_merge.merge.command import MergeOptions
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.optimize.builder import DeltaOptimizeBuilder
from streaming_merge.optimize.metrics import OptimizeMetrics
from streaming_merge.optimize.options import OptimizeOptions
from streaming_merge.streaming.compaction import AutoCompact
from streaming_merge.streaming.progress import MergeProgress, MergeProgressListener
from streaming_merge.streaming.sink import MergeSink

__all__ = [
    "AutoCompact",
    "DeltaMergeBuilder",
    "DeltaOptimizeBuilder",
    "DeltaTable",
    "MergeMetrics",
    "MergeOptions",
    "MergeProgress",
    "MergeProgressListener",
    "MergeSink",
    "OptimizeMetrics",
    "OptimizeOptions",
    "errors",
]
