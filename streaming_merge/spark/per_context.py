"""Values built from Spark Columns once and reused, per SparkContext.

Building a plan's expressions in PySpark is one Python→JVM round trip per Column operation,
hundreds per plan, and a stream builds the same plan every micro-batch. The expressions are
JVM objects of the SparkContext that built them, so a new SparkContext starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class PerContext(Generic[V]):
    """``build()`` results by key, for the SparkContext of the latest call (at most ``limit``)."""

    def __init__(self, limit: int = 64) -> None:
        self._limit = limit
        self._values: dict[Hashable, V] = {}
        self._context: Any = None

    def get(self, context: Any, key: Hashable, build: Callable[[], V]) -> V:
        # A new SparkContext (the old expressions live in a stopped JVM), or a full cache: start afresh.
        if context is not self._context or len(self._values) >= self._limit:
            self._values.clear()
            self._context = context
        found = self._values.get(key)
        if found is None:
            found = self._values[key] = build()
        return found
