"""Reading Delta's change data feed: ``DeltaTable.changes()`` (a batch DataFrame) and the
``delta_changes`` streaming source (``register(spark)``, then ``spark.readStream``).

Names are imported on first use: Spark's Python workers import the source module to read
files, and should not pay for the driver's planning and Spark code.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SHORT_NAME",
    "ChangeDataFeedError",
    "ChangeDataNotRecordedError",
    "ChangeDataSchemaChangedError",
    "register",
]

_HOMES = {
    "SHORT_NAME": "streaming_merge.cdf.source",
    "register": "streaming_merge.cdf.source",
    "ChangeDataFeedError": "streaming_merge.cdf.errors",
    "ChangeDataNotRecordedError": "streaming_merge.cdf.errors",
    "ChangeDataSchemaChangedError": "streaming_merge.cdf.errors",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'streaming_merge.cdf' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
