"""temporary_conf: the block's settings hold inside it and the previous ones come back."""

from __future__ import annotations

from typing import Any

import pytest

from streaming_merge.spark.conf import temporary_conf


class _Conf:
    """A session's runtime conf that records every change made to it."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)
        self.changes: list[tuple[str, str | None]] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.changes.append((key, value))
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.changes.append((key, None))
        self.values.pop(key, None)


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_settings_hold_inside_and_the_previous_values_or_their_absence_come_back() -> None:
    session: Any = _Session({"a": "1", "b": "2"})
    with temporary_conf(session, {"a": "10", "c": "30"}):
        assert session.conf.values == {"a": "10", "b": "2", "c": "30"}
    assert session.conf.values == {"a": "1", "b": "2"}


def test_a_setting_already_as_wanted_is_neither_set_nor_restored() -> None:
    """A write inside the sink's batch asks for the settings the batch already holds: no change,
    so nothing to undo (and no round trip to the JVM)."""
    session: Any = _Session({"a": "1"})
    with temporary_conf(session, {"a": "10", "b": "20"}):
        changes_before = len(session.conf.changes)
        with temporary_conf(session, {"a": "10", "b": "20"}):
            assert session.conf.values == {"a": "10", "b": "20"}
        assert len(session.conf.changes) == changes_before
        assert session.conf.values == {"a": "10", "b": "20"}
    assert session.conf.values == {"a": "1"}
    assert session.conf.changes == [("a", "10"), ("b", "20"), ("a", "1"), ("b", None)]


def test_the_previous_values_come_back_when_the_block_fails() -> None:
    session: Any = _Session({"a": "1"})
    with pytest.raises(RuntimeError, match="boom"), temporary_conf(session, {"a": "2", "b": "3"}):
        raise RuntimeError("boom")
    assert session.conf.values == {"a": "1"}


def test_an_excluded_rule_joins_the_callers_exclusions_once() -> None:
    from streaming_merge.merge.command import with_excluded_rule

    rule = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"
    assert with_excluded_rule(None, rule) == rule
    assert with_excluded_rule("", rule) == rule
    assert with_excluded_rule(" a.B , c.D ", rule) == f"a.B,c.D,{rule}"
    assert with_excluded_rule(f"a.B,{rule}", rule) == f"a.B,{rule}"
