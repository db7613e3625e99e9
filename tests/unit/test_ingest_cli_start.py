"""The Kafka CLI's start-up options (jobs.kafka_cdc_ingest): the driver JVM's JIT policy."""

from __future__ import annotations

import pytest

from jobs.kafka_cdc_ingest import IngestConfig, driver_jit, parse_args

BASE = ["--bootstrap-servers", "127.0.0.1:9092", "--topics", "t", "--target", "/tmp/t", "--keys", "id",
        "--checkpoint", "/tmp/c"]


def test_the_driver_jit_is_c1_for_available_now_runs_late_c2_otherwise_unless_chosen() -> None:
    config, _, _ = parse_args(BASE)
    assert isinstance(config, IngestConfig) and config.driver_jit == "auto"
    assert driver_jit(config) == "late-c2", "a run that goes on keeps C2 for code that stays hot"
    config, _, _ = parse_args([*BASE, "--available-now"])
    assert driver_jit(config) == "c1", "a run that ends once caught up starts fastest with C1 alone"
    for policy in ("tiered", "c1", "late-c2"):
        for flags in ([], ["--available-now"]):
            config, _, _ = parse_args([*BASE, *flags, "--jit", policy])
            assert config.driver_jit == policy and driver_jit(config) == policy
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--jit", "c3"])
