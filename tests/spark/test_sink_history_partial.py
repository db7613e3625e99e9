"""Partial updates with SCD type 2 (``ignore_null_updates``, per column, Debezium's
placeholder): an upsert's missing values are carried from the key's events before it, then its
tracked columns decide whether it opens a version; checked against the reference model in
tests/history_model.py with random events, late events, deletes and truncates."""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from streaming_merge import MergeSink
from tests.history_model import Scd2Model
from tests.partial_model import presence
from tests.spark.test_sink import frame
from tests.spark.test_sink_history import e, history
from tests.spark.test_sink_partial import PLACEHOLDER

MODES: dict[str, tuple[dict[str, Any], bool | set[str], str | None]] = {
    "nulls": ({"ignore_null_updates": True}, True, None),
    "name_only": ({"ignore_null_updates_column_list": ["name"]}, {"name"}, None),
    "placeholder_all_but_amount": ({"ignore_null_updates_except_column_list": ["amount"],
                                    "unavailable_value": PLACEHOLDER}, {"op", "name"}, PLACEHOLDER),
}

changes = st.fixed_dictionaries({
    "id": st.integers(0, 2),
    "lsn": st.integers(0, 10),
    "op": st.sampled_from(["c", "u", "u", "d"]),
    "name": st.sampled_from([None, "a", "b", PLACEHOLDER]),
    "amount": st.sampled_from([None, 1, 2]),
})
truncate = st.builds(lambda lsn: {"id": None, "lsn": lsn, "op": "t", "name": None, "amount": None},
                     st.integers(0, 10))
batches = st.lists(st.lists(st.one_of(changes, changes, changes, changes, truncate), min_size=1, max_size=6),
                   min_size=1, max_size=3)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batches=batches, mode=st.sampled_from(sorted(MODES)))
# a NULL name is the version's name: the amount changed, a new version (op is untracked)
@example(batches=[[e(0, 1, "c", "a", 1)], [e(0, 2, "u", None, 2)]], mode="nulls")
# a late event between two versions takes its missing values from the version before it
@example(batches=[[e(0, 1, "c", "a", 1), e(0, 5, "u", "b", 2)], [e(0, 3, "u", None, 7)]], mode="name_only")
# after a delete nothing is carried: the placeholder lands as NULL
@example(batches=[[e(0, 1, "c", "a", 1), e(0, 2, "d", None, None)], [e(0, 3, "u", PLACEHOLDER, 3)]],
         mode="placeholder_all_but_amount")
def test_scd2_partial_updates_agree_with_the_model(spark: SparkSession, batches: list[list[dict[str, Any]]],
                                                   mode: str) -> None:
    options, ignore_nulls, placeholder = MODES[mode]
    model = Scd2Model(["name", "amount"], ["lsn", "op"], presence(ignore_nulls, placeholder))
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/t"
        sink = MergeSink(path, keys="id", sequence_by="lsn", apply_as_deletes="op = 'd'",
                         apply_as_truncates="op = 't'", stored_as_scd_type=2, app_id="scd2-partial",
                         track_history_except_column_list=["op"], **options)
        for batch_id, batch in enumerate(batches):
            sink(frame(spark, batch), batch_id)
            model.apply(batch)
        assert history(path) == model.table()
