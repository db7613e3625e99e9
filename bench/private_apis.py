"""Each use of private Spark or py4j state, with and without it, on the path it speeds up.

    python -m bench.private_apis                       # every part
    python -m bench.private_apis --parts merge,lookup --rounds 8
    python -m bench.private_apis --parts start --starts 2

Every part runs its variants interleaved (A B A B ...) so that the noise of a shared machine
falls on both, and prints each variant's median in ms, the difference, and the difference as a
share of the path's median (the baseline: every private use on). bench/private_apis.md holds the
figures and the verdict on each use.

Parts:

* ``merge``: a 1k-row upsert into a 10k-row Delta table (warm), the path of a MERGE and of a
  sink batch. Variants: ``all on``; ``no TCP_NODELAY`` (the JVM's end of the thread's py4j
  connection back to Nagle's algorithm: ``answers_at_once``); ``default parallelism``
  (``slots.task_slots`` answers Spark's default parallelism, not the scheduler's slots). The
  py4j round trips per MERGE are counted, and the time spent waiting on lookups by name
  (reflection commands) and on answers over 8 KB summed: those figures, exact, are what py4j
  memos and TCP_NODELAY save; the wall times of a 2-core machine shared with other work vary
  more than that. (Two py4j memos, a patched ``JVMView`` and method-remembering class proxies,
  were measured with this part at commit 4e7846f and removed: bench/private_apis.md.)
* ``slots``: a 10k-row upsert into 1M rows, its joins and writes sized by the scheduler's task
  slots (``slots.task_slots``, a ``private[spark]`` method) or by Spark's default parallelism.
* ``dvmerge``: a 5k-row upsert (4k updates) into a 50k-row table with deletion vectors, whose
  observed positions come back as texts over 8 KB, with and without TCP_NODELAY.
* ``answer``: one py4j answer of 60 KB (an observed id list's size), with and without TCP_NODELAY.
* ``lookup``: a 2M-row scan that looks each row's number up in a 40-key constant table
  (``constant_lookup.lookup``, as a deletion-vector read does), and one that reads a 50k-word
  array literal a row (a DV read's bitset), the arrays as UnsafeArrayData literals or parsed
  from JSON.
* ``observe``: reading an observation of 80k longs (a DV MERGE's positions): field by field
  (``observed_longs.observed_row``, through ``Observation._jo``) or PySpark's ``Observation.get``.
  The path is the observed query plus the read.
* ``start``: fresh driver processes (``--starts`` of each, alternated): from the process's start
  to the end of a stream's first batch (a Python data source, as the Kafka job's), with and
  without ``python_sources`` answering Spark's search for installed data sources, and the stop
  after it with ``session.stop_session`` or plain ``spark.stop()``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PARTS = ("merge", "slots", "dvmerge", "answer", "lookup", "observe", "start")


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _report(title: str, path: str, samples: dict[str, list[float]], extra: dict[str, str] | None = None) -> None:
    names = list(samples)
    base = _median_ms(samples[names[0]])
    print(f"\n{title} (path: {path}; {len(samples[names[0]])} runs each, medians)")
    for name in names:
        median = _median_ms(samples[name])
        note = f"  ({extra[name]})" if extra and name in extra else ""
        if name == names[0]:
            print(f"  {name:<22} {median:9.1f} ms{note}")
        else:
            print(f"  {name:<22} {median:9.1f} ms   +{median - base:7.1f} ms = {100 * (median - base) / base:5.1f} % "
                  f"of the path{note}")


def _interleaved(variants: dict[str, Callable[[], Any]], rounds: int,
                 toggles: dict[str, tuple[Callable[[], None], Callable[[], None]]]) -> dict[str, list[float]]:
    """Run every variant once per round, in an order that rotates; ``toggles`` turn a private
    use off before its variant and back on after."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_number in range(rounds):
        order = names[round_number % len(names):] + names[:round_number % len(names)]
        for name in order:
            off, on = toggles.get(name, (lambda: None, lambda: None))
            off()
            try:
                started = time.perf_counter()
                variants[name]()
                samples[name].append(time.perf_counter() - started)
            finally:
                on()
    return samples


class _CommandClock:
    """Counts the py4j commands sent and times the reflection ones (a class, package or member
    looked up by name), which the view patch and the method memo save."""

    def __init__(self, spark: Any) -> None:
        from py4j import protocol

        self.calls = 0
        self.lookup_seconds = 0.0
        self.long_answers = 0  # over the JVM's 8 KB write buffer: several writes, Nagle's wait
        self.long_answer_seconds = 0.0
        client = spark.sparkContext._gateway._gateway_client
        original = client.send_command

        def clocked(command: str, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            started = time.perf_counter()
            answer = original(command, *args, **kwargs)
            took = time.perf_counter() - started
            if command.startswith(protocol.REFLECTION_COMMAND_NAME):
                self.lookup_seconds += took
            if isinstance(answer, str) and len(answer) > 8192:
                self.long_answers += 1
                self.long_answer_seconds += took
            return answer

        client.send_command = clocked


# --- toggles -------------------------------------------------------------------------------------

def _no_delay_toggle(spark: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    from streaming_merge.spark import answers_at_once as answers

    answers.answer_at_once(spark)
    ours = answers._thread_connection(spark)
    jvm_end = answers._find(answers._python_connections(spark), lambda s: s.getPort(), ours.socket.getsockname()[1])
    socket = jvm_end.getSocket()
    return (lambda: socket.setTcpNoDelay(False)), (lambda: socket.setTcpNoDelay(True))


def _slots_toggle(spark: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    from streaming_merge.spark import slots

    real = slots.task_slots
    holders = [m for m in list(sys.modules.values()) if getattr(m, "task_slots", None) is real]

    def default_parallelism(session: Any) -> int:
        return max(1, int(session.sparkContext.defaultParallelism))

    def set_to(function: Callable[[Any], int]) -> None:
        for module in holders:
            module.task_slots = function

    return (lambda: set_to(default_parallelism)), (lambda: set_to(real))


# --- parts ---------------------------------------------------------------------------------------

def part_merge(spark: Any, workdir: Path, rounds: int) -> None:
    from pyspark.sql import functions as F

    from streaming_merge import DeltaTable

    target = workdir / "merge_target"
    DeltaTable.createFromDataFrame(spark.range(10_000).select("id", (F.col("id") * 2).alias("v")), str(target))
    batch = spark.range(9_500, 10_500).select("id", F.lit(-1).cast("bigint").alias("v")).cache()
    batch.count()
    counter = _CommandClock(spark)
    calls: dict[str, list[int]] = {}
    lookup_ms: dict[str, list[float]] = {}
    long_answers: dict[str, list[tuple[int, float]]] = {}
    current = [""]

    def merge() -> None:
        before, before_lookups = counter.calls, counter.lookup_seconds
        before_long, before_long_seconds = counter.long_answers, counter.long_answer_seconds
        (DeltaTable.forPath(spark, str(target)).alias("t").merge(batch.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        calls.setdefault(current[0], []).append(counter.calls - before)
        lookup_ms.setdefault(current[0], []).append(1000 * (counter.lookup_seconds - before_lookups))
        long_answers.setdefault(current[0], []).append(
            (counter.long_answers - before_long, 1000 * (counter.long_answer_seconds - before_long_seconds)))

    for _ in range(4):  # the JIT's warm-up, untimed
        merge()
    toggles = {"no TCP_NODELAY": _no_delay_toggle(spark), "default parallelism": _slots_toggle(spark)}
    names = ["all on", *toggles]

    def variant(name: str) -> Callable[[], None]:
        def run() -> None:
            current[0] = name
            merge()
        return run

    samples = _interleaved({name: variant(name) for name in names}, rounds, toggles)
    extra = {name: f"{statistics.median(calls[name]):.0f} py4j calls, {statistics.median(lookup_ms[name]):.1f} ms "
                   f"waiting on lookups by name, {_long(long_answers[name])}" for name in names}
    _report("MERGE 1k rows into 10k", "a 1k-row MERGE batch", samples, extra)


def part_slots(spark: Any, workdir: Path, rounds: int) -> None:
    from pyspark.sql import functions as F

    from streaming_merge import DeltaTable

    target = workdir / "slots_target"
    DeltaTable.createFromDataFrame(spark.range(1_000_000).select("id", (F.col("id") * 2).alias("v")), str(target))
    batch = spark.range(900_000, 1_000_000, 10).select("id", F.lit(-1).cast("bigint").alias("v")).cache()
    batch.count()

    def merge() -> None:
        (DeltaTable.forPath(spark, str(target)).alias("t").merge(batch.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    merge()
    samples = _interleaved({"task slots": merge, "default parallelism": merge}, rounds,
                           {"default parallelism": _slots_toggle(spark)})
    _report("MERGE 10k rows into 1M", "a 10k-row MERGE batch", samples)


def part_dvmerge(spark: Any, workdir: Path, rounds: int) -> None:
    from pyspark.sql import functions as F

    from streaming_merge import DeltaTable

    target = workdir / "dv_target"
    DeltaTable.createFromDataFrame(spark.range(50_000).select("id", (F.col("id") * 2).alias("v")), str(target),
                                   properties={"delta.enableDeletionVectors": "true"})
    batch = spark.range(46_000, 51_000).select("id", F.lit(-1).cast("bigint").alias("v")).cache()
    batch.count()

    counter = _CommandClock(spark)
    long_answers: dict[str, list[tuple[int, float]]] = {}
    current = [""]

    def merge() -> None:
        before, before_seconds = counter.long_answers, counter.long_answer_seconds
        (DeltaTable.forPath(spark, str(target)).alias("t").merge(batch.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        long_answers.setdefault(current[0], []).append(
            (counter.long_answers - before, 1000 * (counter.long_answer_seconds - before_seconds)))

    def variant(name: str) -> Callable[[], None]:
        def run() -> None:
            current[0] = name
            merge()
        return run

    for _ in range(3):
        merge()
    names = ["all on", "no TCP_NODELAY"]
    samples = _interleaved({name: variant(name) for name in names}, rounds, {"no TCP_NODELAY": _no_delay_toggle(spark)})
    _report("DV MERGE 5k rows (4k updates) into 50k", "a 5k-row MERGE batch with deletion vectors", samples,
            {name: _long(long_answers[name]) for name in names})


def _long(samples: list[tuple[int, float]]) -> str:
    """The median number of answers over 8 KB in a run and the median time spent on them."""
    return (f"{statistics.median(count for count, _ in samples):.0f} answers over 8 KB taking "
            f"{statistics.median(ms for _, ms in samples):.1f} ms")


def part_answer(spark: Any, rounds: int) -> None:
    from streaming_merge.spark.jvm import jvm_class

    off, on = _no_delay_toggle(spark)
    strings = jvm_class(spark, "org.apache.commons.lang3.StringUtils")

    def answer() -> None:
        strings.repeat("1234567890,", 5_500)  # 60 KB back

    samples = _interleaved({"TCP_NODELAY": answer, "Nagle": answer}, rounds * 5, {"Nagle": (off, on)})
    _report("one 60 KB py4j answer", "one py4j call", samples)


def part_lookup(spark: Any, rounds: int) -> None:
    import numpy as np
    from pyspark.sql import functions as F

    from streaming_merge.spark import constant_lookup

    keys = [int(k) * 104_729 for k in range(40)]
    values = list(range(1, 41))
    frame = spark.range(2_000_000).select((F.col("id") % 60 * 104_729).alias("file_id"))
    real = constant_lookup._unsafe_long_array

    def refuse(*args: Any) -> Any:
        raise NotImplementedError

    def scan() -> None:
        frame.select(F.sum(constant_lookup.lookup(spark, keys, values, F.col("file_id")))).collect()

    def off() -> None:
        constant_lookup._unsafe_long_array = refuse  # type: ignore[assignment]

    def on() -> None:
        constant_lookup._unsafe_long_array = real  # type: ignore[assignment]

    words = np.random.default_rng(1).integers(-(2**62), 2**62, size=50_000)

    def bitset_scan() -> None:  # a DV read's bitset of a 3.2M-row file: one word a row
        array = constant_lookup.long_array(spark, words)
        frame.select(F.sum(F.element_at(array, (F.col("file_id") % 50_000 + 1).cast("int")) % 7)).collect()

    for _ in range(3):
        scan()
        bitset_scan()
    samples = _interleaved({"UnsafeArrayData": scan, "JSON literal": scan}, rounds, {"JSON literal": (off, on)})
    _report("2M-row scan with a 40-key lookup", "the scan", samples)
    samples = _interleaved({"UnsafeArrayData": bitset_scan, "JSON literal": bitset_scan}, rounds,
                           {"JSON literal": (off, on)})
    _report("2M-row scan reading a 50k-word array literal", "the scan", samples)


def part_observe(spark: Any, rounds: int) -> None:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from streaming_merge.spark.observed_longs import long_list, observed_row

    frame = spark.range(80_000).select((F.col("id") * 7_919 + (1 << 40)).alias("position"))

    def observed(read: Callable[[Observation], Any]) -> Callable[[], None]:
        def run() -> None:
            observation = Observation()
            frame.observe(observation, long_list(F.col("position")).alias("positions")).write.format("noop") \
                .mode("overwrite").save()
            read(observation)
        return run

    fields = observed(lambda o: observed_row(spark, o, lambda name: True))
    pickled = observed(lambda o: o.get)
    for _ in range(2):
        fields()
        pickled()
    samples = _interleaved({"observed_row (_jo)": fields, "Observation.get": pickled}, rounds, {})
    _report("an observed query of 80k longs and its read", "the query and the read", samples)


_START_CHILD = r"""
import json, sys, time
started = float(sys.argv[1]); shortcut = sys.argv[2] == "1"; fast_stop = sys.argv[3] == "1"; out = sys.argv[4]
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from streaming_merge.session import local_session, stop_session
from streaming_merge.spark import python_sources

class Reader(DataSourceStreamReader):
    def initialOffset(self): return {"n": 0}
    def latestOffset(self): return {"n": 3}
    def partitions(self, start, end): return [InputPartition(0)]
    def read(self, partition):
        yield from ((i,) for i in range(3))
    def commit(self, end): pass

class Source(DataSource):
    @classmethod
    def name(cls): return "bench_private_apis"
    def schema(self): return "id long"
    def streamReader(self, schema): return Reader()

spark = local_session("bench_private_apis")
session_up = time.time()
t0 = time.perf_counter()
if shortcut:
    python_sources._answer_installed_lookup(spark)
spark.dataSource.register(Source)
register = time.perf_counter() - t0
rows = []
query = (spark.readStream.format("bench_private_apis").load().writeStream
         .foreachBatch(lambda frame, batch_id: rows.append(frame.count()))
         .option("checkpointLocation", out + ".chk").trigger(availableNow=True).start())
query.awaitTermination()
first_batch = time.time()
t0 = time.perf_counter()
(stop_session if fast_stop else lambda s: s.stop())(spark)
stop = time.perf_counter() - t0
json.dump({"session": session_up - started, "register": register, "first_batch": first_batch - started,
           "stop": stop, "rows": rows}, open(out, "w"))
"""


def part_start(starts: int, workdir: Path) -> None:
    results: dict[str, list[dict[str, float]]] = {"all on": [], "all off": []}
    for number in range(starts):
        for name in (["all on", "all off"] if number % 2 == 0 else ["all off", "all on"]):
            on = "1" if name == "all on" else "0"
            out = workdir / f"start_{number}_{on}.json"
            subprocess.run([sys.executable, "-c", _START_CHILD, repr(time.time()), on, on, str(out)], check=True,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"})
            results[name].append(json.loads(out.read_text()))
    print(f"\nfresh driver processes ({starts} each, alternated; medians, ms)")
    figures = {name: {key: 1000 * statistics.median(run[key] for run in runs)
                      for key in ("session", "register", "first_batch", "stop")} for name, runs in results.items()}
    for name, figure in figures.items():
        print(f"  {name:<8} session up {figure['session']:7.0f}  register {figure['register']:6.0f}  "
              f"start to first batch {figure['first_batch']:7.0f}  stop {figure['stop']:6.0f}")
    on, off = figures["all on"], figures["all off"]
    print(f"  python_sources: register {off['register'] - on['register']:+.0f} ms without it = "
          f"{100 * (off['register'] - on['register']) / on['first_batch']:.1f} % of the start to the first batch")
    print(f"  stop_session: stop {off['stop'] - on['stop']:+.0f} ms without it = "
          f"{100 * (off['stop'] - on['stop']) / on['stop']:.0f} % of the stop, "
          f"{100 * (off['stop'] - on['stop']) / (on['first_batch'] + on['stop']):.1f} % of start + first batch + stop")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--starts", type=int, default=2, help="fresh driver processes per variant (part start)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="bench_private_apis_") as folder:
        workdir = Path(folder)
        if "start" in parts:
            part_start(args.starts, workdir)
        in_process = [p for p in parts if p != "start"]
        if in_process:
            from streaming_merge.session import local_session, stop_session
            from streaming_merge.spark.answers_at_once import ready_driver_thread

            spark = local_session("bench_private_apis")
            ready_driver_thread(spark)
            try:
                if "answer" in in_process:
                    part_answer(spark, args.rounds)
                if "merge" in in_process:
                    part_merge(spark, workdir, args.rounds)
                if "slots" in in_process:
                    part_slots(spark, workdir, args.rounds)
                if "dvmerge" in in_process:
                    part_dvmerge(spark, workdir, args.rounds)
                if "lookup" in in_process:
                    part_lookup(spark, args.rounds)
                if "observe" in in_process:
                    part_observe(spark, args.rounds)
            finally:
                stop_session(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
