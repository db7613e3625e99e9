"""What each micro-batch of the Kafka ingestion job costs the driver, counted exactly.

    python -m bench.driver_costs [kafka_ingest_bench options]
    python -m bench.driver_costs --events 100000 --max-offsets-per-trigger 5000   # the default run

Wall times on a 2-core machine vary by ±20-30 % from one run to the next, so a change that
saves 100 ms of driver work per batch is invisible in a batch's latency. This runs
``bench.kafka_ingest_bench``'s end-to-end part (``--parts e2e --skip-read-baseline`` unless
given) and, around each call of the job's per-batch steps (``MergeSink.__call__``, which decodes
the records in its copy of the batch, and ``debezium.decode_batch``, which only a new table's first
batch and a replayed one call; rebound for the run, nothing in the library changes), records:

* **py4j calls**: Python→JVM round trips (the gateway client's ``send_command``), exact;
* **Python CPU**: the driver process's own CPU time (``time.process_time``);
* **JVM CPU** of the driver JVM by thread group (``bench.jvm_cpu``: the JIT compilers, the
  garbage collector, the executor tasks, the rest), from ``/proc``, Linux only;
* wall time.

It prints the median of each over the last two thirds of the batches (the first third warms
the JVM up). Compare two trees with ``PYTHONPATH=<tree> python -m bench.driver_costs ...``.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import jvm_cpu
from bench.merge_profile import Py4jCounter

Sample = tuple[int, float, dict[str, float], float]


class DriverCosts:
    """Per-call samples of the functions it wraps (see the module docstring)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[Sample]] = {}
        self._counter: Py4jCounter | None = None
        self._pid: int | None = None

    def wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def measured(*args: Any, **kwargs: Any) -> Any:
            self._install()
            jvm_before = self._jvm()
            calls, cpu, started = self._calls(), time.process_time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.samples.setdefault(label, []).append((
                    self._calls() - calls, (time.process_time() - cpu) * 1000,
                    jvm_cpu.delta_ms(jvm_before, self._jvm()) if jvm_before else {},
                    (time.perf_counter() - started) * 1000))
        return measured

    def _install(self) -> None:
        """Count the calls of the gateway client (once, on the first wrapped call)."""
        if self._pid is not None:
            return
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        assert spark is not None, "a wrapped step ran outside a Spark session"
        self._counter = Py4jCounter(spark)
        self._pid = jvm_cpu.jvm_pid(spark)

    def _calls(self) -> int:
        return self._counter.calls if self._counter is not None else 0

    def _jvm(self) -> dict[str, float]:
        if self._pid is None or not jvm_cpu.available(self._pid):
            return {}
        return jvm_cpu.thread_cpu_seconds(self._pid)

    def report(self) -> str:
        lines = [f"{'step':<8}{'batches':>8}{'py4j calls':>12}{'python cpu':>12}{'jvm cpu':>10}"
                 f"{'wall':>8}  jvm cpu by thread group (ms)"]
        for label, samples in self.samples.items():
            warm = samples[len(samples) // 3:]
            groups = {g: round(statistics.median(s[2].get(g, 0.0) for s in warm)) for g in jvm_cpu.GROUP_NAMES}
            lines.append(
                f"{label:<8}{len(warm):>8}{statistics.median(s[0] for s in warm):>12.0f}"
                f"{statistics.median(s[1] for s in warm):>10.0f}ms"
                f"{statistics.median(sum(s[2].values()) for s in warm):>8.0f}ms"
                f"{statistics.median(s[3] for s in warm):>6.0f}ms  {groups}")
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--parts" not in args:
        args += ["--parts", "e2e", "--skip-read-baseline"]
    if "--events" not in args:
        args += ["--events", "100000", "--max-offsets-per-trigger", "5000"]

    from bench import kafka_ingest_bench
    from streaming_merge.kafka import debezium
    from streaming_merge.streaming.sink import MergeSink

    costs = DriverCosts()
    debezium.decode_batch = costs.wrap("decode", debezium.decode_batch)  # type: ignore[assignment]
    MergeSink.__call__ = costs.wrap("sink", MergeSink.__call__)  # type: ignore[method-assign]
    status = kafka_ingest_bench.main(args)
    print("\nDriver costs per micro-batch (median of the last two thirds of the batches):")
    print(costs.report())
    return status


if __name__ == "__main__":
    sys.exit(main())
