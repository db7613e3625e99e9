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
        if context is not self._context:  # a new SparkContext: the old objects live in a stopped JVM
            self._values.clear()
            self._context = context
        found = self._values.get(key)
        if found is None:
            # Full: start afresh, but only to make room for a new key (clearing on every call at
            # the limit rebuilt a one-entry cache's value each time it was asked for).
            if len(self._values) >= self._limit:
                self._values.clear()
            found = self._values[key] = build()
        return found
