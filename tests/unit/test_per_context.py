"""streaming_merge.spark.per_context: values built once per SparkContext, at most ``limit`` kept."""

from __future__ import annotations

from streaming_merge.spark.per_context import PerContext


def test_a_full_cache_keeps_its_values_until_a_new_key_needs_room() -> None:
    built: list[str] = []
    cache: PerContext[str] = PerContext(limit=1)
    context = object()

    def build(value: str) -> str:
        built.append(value)
        return value

    assert cache.get(context, "a", lambda: build("a")) == "a"
    assert cache.get(context, "a", lambda: build("a again")) == "a"  # full, but the key is there
    assert cache.get(context, "b", lambda: build("b")) == "b"  # room made for a new key
    assert cache.get(context, "b", lambda: build("b again")) == "b"
    assert cache.get(object(), "b", lambda: build("b in a new context")) == "b in a new context"
    assert built == ["a", "b", "b in a new context"]
