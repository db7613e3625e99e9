"""Deletion-vector reads of a stream of upserts into a table with deletion vectors.

    python -m bench.dv_reads                               # 20 upserts of 5k rows into 1M rows (20 files)
    python -m bench.dv_reads --latency-ms 30               # each DV request also waits 30 ms (an object store)
    python -m bench.dv_reads --target-rows 200000 --batches 6 --batch-rows 2000   # smoke run

Every scan of a file with a vector needs the rows it deletes, and each upsert of a stream gives
most files a new vector, which the next upsert's scan applies. This counts what that costs
where it is paid, on the driver, before any Spark job: the object-store requests for DV files
(``obstore.get_range`` / ``get_ranges``, counted by wrapping them), the DV entries they
fetch and the time spent in them, per upsert (``DeltaTable.merge`` into the same table, one
after the other, as ``MergeSink`` runs them), and for a cold read of the final table (every
in-process cache of vectors dropped first: a new process, or vectors another writer wrote).

``--latency-ms`` adds that wait to every request, a stand-in for an object store's round trip
(tens of ms on S3); the local disk of this machine answers in well under a millisecond, so
the request count is the figure that carries over. Run it on two checkouts with ``PYTHONPATH``
to compare them (it uses the public API and patches only obstore's module functions).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import obstore
import pyarrow.parquet as pq

from bench.merge_bench import make_batch, make_target, write_target


class RequestCounter:
    """Wraps obstore's ranged reads: requests, DV entries asked for and seconds spent."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.requests = 0
        self.entries = 0
        self.seconds = 0.0
        self._originals = {name: getattr(obstore, name) for name in ("get_range", "get_ranges")}

    def install(self) -> None:
        for name, original in self._originals.items():
            setattr(obstore, name, self._counted(original, name))

    def _counted(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(store: Any, path: str, **kwargs: Any) -> Any:
            started = time.perf_counter()
            if self.latency_s:
                time.sleep(self.latency_s)
            try:
                return original(store, path, **kwargs)
            finally:
                self.requests += 1
                self.entries += len(kwargs["starts"]) if name == "get_ranges" else 1
                self.seconds += time.perf_counter() - started
        return counted

    def take(self) -> tuple[int, int, float]:
        """Requests, entries and ms since the last call."""
        taken = (self.requests, self.entries, self.seconds * 1000)
        self.requests, self.entries, self.seconds = 0, 0, 0.0
        return taken


def _drop_vector_caches() -> None:
    """Forget every vector this process holds (whichever modules this checkout has)."""
    import importlib
    from collections import OrderedDict

    for module_name in ("streaming_merge.table.dv_positions", "streaming_merge.table.dv_filter"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, "_cache"):
            module._cache = OrderedDict()
            module._cache_bytes = 0
        if hasattr(module, "_built"):
            module._built = type(module._built)(limit=16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-rows", type=int, default=1_000_000)
    parser.add_argument("--target-files", type=int, default=20)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-rows", type=int, default=5_000)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)

    from streaming_merge import DeltaTable
    from streaming_merge.session import local_session

    spark = local_session("dv_reads", "local[2]")
    work = Path(tempfile.mkdtemp(prefix="dv_reads-"))
    counter = RequestCounter(args.latency_ms / 1000)
    try:
        path = work / "t"
        write_target(make_target(args.target_rows, 7), path, args.target_files)
        DeltaTable.forPath(spark, str(path)).setProperties({"delta.enableDeletionVectors": "true"})
        counter.install()
        rows: list[tuple[int, int, float, float]] = []
        for batch in range(args.batches):
            source_dir = work / f"batch-{batch}"
            source_dir.mkdir()
            pq.write_table(make_batch(args.target_rows, args.batch_rows, "uniform", 100 + batch).table,
                           source_dir / "part-0.parquet")
            source = spark.read.parquet(str(source_dir))
            counter.take()
            started = time.perf_counter()
            (DeltaTable.forPath(spark, str(path)).alias("t").merge(source.alias("s"), "t.id = s.id")
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
            wall = (time.perf_counter() - started) * 1000
            requests, entries, ms = counter.take()
            rows.append((requests, entries, ms, wall))
            shutil.rmtree(source_dir)
        print(f"{args.batches} upserts of {args.batch_rows:,} rows into {args.target_rows:,} rows "
              f"({args.target_files} files, deletion vectors), extra latency {args.latency_ms:g} ms a request")
        print(" batch | DV requests | DV entries | ms in DV reads | MERGE ms")
        for i, (requests, entries, ms, wall) in enumerate(rows):
            print(f" {i:5d} | {requests:11d} | {entries:10d} | {ms:14.1f} | {wall:8.0f}")
        later = rows[1:] or rows
        print(f"after the first upsert, per upsert: requests {statistics.median(r[0] for r in later):g}, "
              f"entries {statistics.median(r[1] for r in later):g}, "
              f"ms in DV reads {statistics.median(r[2] for r in later):.1f}, "
              f"MERGE {statistics.median(r[3] for r in later):.0f} ms (medians)")
        snapshot_files = len(deltalake.DeltaTable(str(path)).file_uris())
        _drop_vector_caches()
        counter.take()
        started = time.perf_counter()
        count = DeltaTable.forPath(spark, str(path)).toDF().count()
        wall = (time.perf_counter() - started) * 1000
        requests, entries, ms = counter.take()
        dv_files = len(list(path.glob("deletion_vector_*.bin")))
        print(f"cold read of the final table ({count:,} rows, {snapshot_files} files, {dv_files} DV files): "
              f"requests {requests}, entries {entries}, ms in DV reads {ms:.1f}, count {wall:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
