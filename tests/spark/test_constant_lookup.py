"""The constant-time lookup of a row's number in a constant table (streaming_merge.spark.constant_lookup),
against a Python dict: every key, numbers that are no key, negative and extreme keys, every size
from the list scan to the two-level perfect hash."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streaming_merge.spark.constant_lookup import _perfect_hash, _unsafe_long_array, long_array, lookup
from streaming_merge.table.dv_filter import bitset_membership


@pytest.mark.parametrize("count", [0, 1, 8, 9, 40, 700])
def test_lookup_answers_as_a_dict_does(spark: SparkSession, count: int) -> None:
    rng = np.random.default_rng(count)
    # Distinct multiples of 7919 from -2**40 on, drawn without building the 277M candidates
    # (np.arange of them took 4.7 s and 2.2 GB a case).
    keys = [int(k) * 7919 - 2**40 for k in rng.choice(2**41 // 7919, size=count, replace=False)]
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


@pytest.mark.parametrize(("with_sets", "without", "negative"),
                         [(3, 2, False), (12, 9, False), (30, 40, True), (100, 60, False)])
def test_bitset_membership_with_every_key_known_answers_as_sets_do(spark: SparkSession, with_sets: int,
                                                                   without: int, negative: bool) -> None:
    """The DV test of a scan whose every file is known (the files without a vector share a
    bitset of zeros, the lookup skips its miss test, and non-negative ids take a plain
    remainder) against Python sets, for the list scan, the one modulus and the two levels."""
    rng = np.random.default_rng(with_sets)
    pool = np.arange(-(2**40), 2**40, 104729) if negative else np.arange(0, 2**40, 104729)
    keys = [int(k) for k in rng.choice(pool, size=with_sets + without, replace=False)]
    bounds = {k: int(rng.integers(1, 300)) for k in keys}
    sets = {k: np.unique(rng.integers(0, bounds[k], size=bounds[k] // 3)).astype(np.int64) for k in keys[:with_sets]}
    none_deleted = {k: bounds[k] for k in keys[with_sets:]}
    rows = [(k, r) for k in keys for r in range(bounds[k])]
    frame = spark.createDataFrame(rows, "key bigint, row bigint")
    test = bitset_membership(spark, F.col("key"), F.col("row"), {k: (v, bounds[k]) for k, v in sets.items()},
                             none_deleted)
    deleted = {(r["key"], r["row"]) for r in frame.filter(test).collect()}
    assert deleted == {(k, int(p)) for k, positions in sets.items() for p in positions}


def test_in_row_ids_finds_exactly_the_given_row_ids(spark: SparkSession) -> None:
    """Ids of three partitions, some partitions without any, rows past a partition's last id."""
    from streaming_merge.merge.dv_source_side import in_row_ids

    frame = spark.range(0, 3000, 1, 4).withColumn("rid", F.monotonically_increasing_id())
    row_ids = np.array([r.rid for r in frame.select("rid").collect()])
    rng = np.random.default_rng(5)
    for chosen in (np.zeros(0, dtype=np.int64), row_ids[:1], row_ids[-2:], rng.choice(row_ids, 40, replace=False),
                   row_ids[row_ids >> 33 != 1][::3]):
        found = {r.rid for r in frame.filter(in_row_ids(spark, chosen, F.col("rid"))).collect()}
        assert found == set(chosen.tolist())
