"""The constant-time lookup of a row's number in a constant table (streaming_merge.spark.constant_lookup),
against a Python dict: every key, numbers that are no key, negative and extreme keys, every size
from the list scan to the two-level perfect hash."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streaming_merge.spark.constant_lookup import _perfect_hash, _unsafe_long_array, long_array, lookup


@pytest.mark.parametrize("count", [0, 1, 8, 9, 40, 700])
def test_lookup_answers_as_a_dict_does(spark: SparkSession, count: int) -> None:
    rng = np.random.default_rng(count)
    keys = [int(k) for k in rng.choice(np.arange(-(2**40), 2**40, 7919), size=count, replace=False)]
    if count >= 9:
        keys[:2] = [2**63 - 1, -(2**63)]  # the extremes, as path-hash file ids may be
    values = [int(v) for v in rng.integers(1, 2**40, size=count)]
    table = dict(zip(keys, values, strict=True))
    probes = keys + [k + 1 for k in keys if k + 1 not in table and k < 2**63 - 1] + [0, 12345]
    frame = spark.createDataFrame([(p,) for p in probes], "probe bigint")
    found = frame.select("probe", lookup(spark, keys, values, F.col("probe"), missing=-7).alias("value")).collect()
    assert {(r["probe"], r["value"]) for r in found} == {(p, table.get(p, -7)) for p in probes}


def test_the_perfect_hash_gives_every_key_its_own_slot_in_about_two_slots_a_key() -> None:
    keys = np.random.default_rng(3).choice(2**50, size=5000, replace=False).astype(np.int64) - 2**49
    plan = _perfect_hash(keys)
    assert plan is not None
    modulus, moduli, offsets, slot_of_key, slots = plan
    buckets = keys % modulus
    assert np.array_equal(offsets[buckets] + keys % moduli[buckets], slot_of_key)
    assert len(np.unique(slot_of_key)) == len(keys) and slot_of_key.max() < slots <= 4 * len(keys)


def test_long_array_is_the_same_array_in_the_jvm_and_as_json(spark: SparkSession) -> None:
    values = [0, -1, 2**63 - 1, -(2**63), 42]
    unsafe = _unsafe_long_array(spark, np.asarray(values, dtype="<i8"))  # not the fallback: it must work here
    row = spark.range(1).select(unsafe.alias("unsafe"), long_array(None, values).alias("json")).first()
    assert row is not None and row["unsafe"] == row["json"] == values


def test_lookup_refuses_repeated_keys(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="distinct"):
        lookup(spark, [1, 1], [2, 3], F.col("id"))
