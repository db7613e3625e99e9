"""How a MergeSink batch's cost grows with the age of the stream: the tombstone table.

    python -m bench.tombstone_growth                    # 40 batches of 1,000 events, 100k-row target
    python -m bench.tombstone_growth --batches 80 --every 20

Every batch with deletes appends a file to the tombstone table, and every later batch's
late-event lookup opens each tombstone file whose key range overlaps the batch's keys (with
uniform keys, all of them). Two sinks apply the same batches (``bench.sink_overhead``'s
workload: one event per id, 5 % deletes) to two copies of one target, alternating which goes
first: ``compacting`` is the sink as shipped (it bin-packs the tombstone files once
``tombstones.COMPACT_SMALL_FILES`` small ones piled up), ``never`` has that threshold out of
reach. Printed: the median batch time and tombstone file count per window of ``--every``
batches, and the ratio. Both tables are compared row for row at the end.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import deltalake

from bench.sink_overhead import create_target, make_workload, to_spark
from streaming_merge import MergeSink
from streaming_merge.session import local_session
from streaming_merge.streaming import tombstones

VARIANTS = ("compacting", "never")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--target-rows", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10, help="batches per reported window")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    spark = local_session("tombstone_growth", "local[2]")
    work = Path(tempfile.mkdtemp(prefix="tombstone_growth-"))
    shipped = tombstones.COMPACT_SMALL_FILES
    try:
        workload = make_workload(args.target_rows, args.batches, args.batch_rows, args.seed)
        create_target(spark, workload.target, str(work / "master"), 8)
        sinks = {}
        for name in VARIANTS:
            shutil.copytree(work / "master", work / name)
            sinks[name] = MergeSink(str(work / name), keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'",
                                    app_id=f"growth-{name}")
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        files: dict[str, list[int]] = {name: [] for name in VARIANTS}
        for batch_id, table in enumerate(workload.batches):
            batch = to_spark(spark, table)
            for name in (VARIANTS if batch_id % 2 == 0 else VARIANTS[::-1]):
                tombstones.COMPACT_SMALL_FILES = shipped if name == "compacting" else 1 << 30
                started = time.perf_counter()
                sinks[name](batch, batch_id)
                times[name].append((time.perf_counter() - started) * 1000)
                files[name].append(len(deltalake.DeltaTable(str(work / f"{name}_tombstones")).file_uris()))
        tombstones.COMPACT_SMALL_FILES = shipped
        print(f"{args.batches} batches of {args.batch_rows} events into {args.target_rows} rows; "
              f"COMPACT_SMALL_FILES={shipped}; median ms per window (tombstone files at its end)")
        print(f"{'batches':>10} " + " ".join(f"{n:>22}" for n in VARIANTS) + f" {'never/compacting':>17}")
        for start in range(0, args.batches, args.every):
            window = slice(start, start + args.every)
            medians = {n: statistics.median(times[n][window]) for n in VARIANTS}
            cells = " ".join(f"{medians[n]:>14.0f} ({files[n][window][-1]:>4} f)" for n in VARIANTS)
            print(f"{start:>4}-{min(start + args.every, args.batches) - 1:<5} {cells} "
                  f"{medians['never'] / medians['compacting']:>17.2f}")
        rows = {n: sorted(deltalake.DeltaTable(str(work / n)).to_pyarrow_table().to_pylist(),
                          key=lambda r: r["id"]) for n in VARIANTS}
        same = rows["compacting"] == rows["never"]
        print(f"check: tables equal: {'✓' if same else '✗'} ({len(rows['never'])} rows)")
        return 0 if same else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
