"""Where a start and a restart spend their time, beside a bare SparkSession in the same run.

    .venv/bin/python -m bench.startup                 # 3 rounds: the job's defaults, late-c2, the JVM's defaults
    .venv/bin/python -m bench.startup --repeat 5 --variants archive:auto,archive:tiered,plain:tiered --idle
    .venv/bin/python -m bench.startup --before /tmp/old-checkout   # also the CLI of another checkout

Each round runs, one after the other (their order rotates from round to round):

- ``bare``: a new Python process that creates a plain ``SparkSession`` (``local[2]``, nothing
  else set), runs one trivial job (``spark.range(10).count()``) and stops it: the reference.
- ``bare+archive``: the same with the driver class archive of ``streaming_merge.session``
  (``-XX:SharedArchiveFile``), what the archive alone does to Spark's own start.
- per variant ``ARCHIVE:JIT`` (``archive``: the jobs' default, ``plain``:
  ``STREAMING_MERGE_CLASS_ARCHIVE=0``; JIT: the CLI's ``--jit``: ``auto``, its default, is
  ``c1`` for these ``--available-now`` runs; ``late-c2`` is what a run that goes on gets;
  ``tiered`` is the JVM's own) and, with ``--before DIR``, ``before`` (the CLI of the checkout in
  DIR, e.g. the commit before this work, with its own code): ``cli-fresh``, the Kafka CLI
  (``python -m jobs.kafka_cdc_ingest --available-now``) on a new 20-record topic of Debezium
  change events with a new checkpoint and table, from process start to exit; then 20 more
  records and ``cli-restart``, the CLI again on that checkpoint, timed to its first committed
  MERGE and to exit; with ``--idle`` also ``cli-idle``, the CLI once more with nothing new.

The broker is the embedded one (``streaming_merge.kafka.broker.EmbeddedKafka``), started once.
The CLI's phases come from ``STREAMING_MERGE_STARTUP_MARKS`` (``streaming_merge.spark.startup_marks``):
the job, the session, the Kafka source's planner process and its executor readers append
timestamped marks to one file; the driver JVM's loaded classes, JIT time and CPU are sampled at
the job's marks (a checkout without marks is timed to its first MERGE by the sink's log line).
Medians over the rounds are printed with each total's ratio to ``bare``'s, and
every run (with the load average before it) goes to ``bench/results/startup.json``. The archive
is built before the first round if it does not exist (timed and reported, not in the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "startup.json"
MARKS_ENV = "STREAMING_MERGE_STARTUP_MARKS"
ARCHIVE_ENV = "STREAMING_MERGE_CLASS_ARCHIVE"
RUN_TIMEOUT_S = 900.0

# (phase, from mark, to mark) of the CLI; "start" is the bench's Popen, "exit" the process's end.
CLI_PHASES = (
    ("python + imports", "start", "job_imports_done"),
    ("launcher", "main", "jvm_start"),
    ("JVM + SparkContext", "jvm_start", "session_ready"),
    ("query start (register, load, start)", "session_ready", "query_started"),
    ("planner process up", "query_started", "source_stream_reader"),
    ("offsets (broker metadata)", "source_stream_reader", "source_partitions"),
    ("batch planned -> foreachBatch", "source_partitions", "batch_start"),
    ("first batch: decode (executor readers)", "batch_start", "batch_decoded"),
    ("first batch: MERGE", "batch_decoded", "merge_committed"),
    ("after the MERGE -> query end", "merge_committed", "query_terminated"),
    ("spark.stop()", "query_terminated", "spark_stopped"),
    ("interpreter exit", "spark_stopped", "exit"),
)
BARE_PHASES = (
    ("python + imports", "start", "imported"),
    ("launcher", "imported", "jvm_start"),
    ("JVM -> gateway", "jvm_start", "gateway"),
    ("SparkContext + session", "gateway", "session"),
    ("first trivial job", "session", "job"),
    ("spark.stop()", "job", "stopped"),
    ("interpreter exit", "stopped", "exit"),
)


# ----------------------------------------------------------------------------- the bare probe


def probe_bare(archive: bool) -> None:
    """In a process of its own: a plain session, one trivial job, stop; marks as JSON on stdout."""
    marks: dict[str, float] = {}
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.sql import SparkSession

    marks["imported"] = time.time()
    conf = SparkConf().setMaster("local[2]").setAppName("bare")
    if archive:
        from streaming_merge.spark import class_archive as _class_archive

        option, build = _class_archive.prepare({}, "")
        if build is not None or option is None:
            if build is not None:
                build.abandon()
            raise SystemExit("the class archive is not built yet (run the CLI with the archive on once)")
        conf.set("spark.driver.extraJavaOptions", option)
    # What getOrCreate() does, in two steps so that the JVM's start and Spark's are told apart.
    SparkContext._ensure_initialized(conf=conf)
    marks["gateway"] = time.time()
    jvm = SparkContext._jvm
    assert jvm is not None
    marks["jvm_start"] = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getStartTime() / 1000.0
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    marks["session"] = time.time()
    spark.range(10).count()
    marks["job"] = time.time()
    classes = int(jvm.java.lang.management.ManagementFactory.getClassLoadingMXBean().getTotalLoadedClassCount())
    spark.stop()
    marks["stopped"] = time.time()
    print(json.dumps({"marks": marks, "jvm_classes": classes}), flush=True)


# ----------------------------------------------------------------------------- running things


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _environment(archive: bool, marks: Path | None = None) -> dict[str, str]:
    env = {**os.environ, ARCHIVE_ENV: "1" if archive else "0"}
    env.pop(MARKS_ENV, None)
    if marks is not None:
        env[MARKS_ENV] = str(marks)
    return env


def run_bare(archive: bool) -> dict[str, Any]:
    load = load_average()
    command = [sys.executable, "-m", "bench.startup", "--probe-bare"] + (["--archive-probe"] if archive else [])
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=_environment(archive),
                            timeout=RUN_TIMEOUT_S, check=False)
    ended = time.time()
    if result.returncode != 0:
        raise RuntimeError(f"bare probe failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-3000:]}")
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    marks = {"start": started, **payload["marks"], "exit": ended}
    return {"scenario": "bare+archive" if archive else "bare", "load": load, "total": ended - started,
            "phases": _phases(BARE_PHASES, marks), "jvm_classes": payload["jvm_classes"],
            "warnings": _jvm_warnings(result.stdout + result.stderr)}


def _jvm_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "[warning][cds" in line or "[error][cds" in line][:5]


def cli_command(bootstrap: str, topic: str, work: Path, extra: Iterable[str] = ()) -> list[str]:
    return [sys.executable, "-m", "jobs.kafka_cdc_ingest", "--bootstrap-servers", bootstrap, "--topics", topic,
            "--target", str(work / "table"), "--keys", "order_id", "--checkpoint", str(work / "checkpoint"),
            "--dead-letter", str(work / "dead_letter"), "--available-now", *extra]


def _first_merge_logged(stderr: str) -> float | None:
    """The time of the sink's first "MergeSink batch N -> ..." log line (the job logs with asctime)."""
    for line in stderr.splitlines():
        if " INFO streaming_merge.streaming.sink: MergeSink batch " in line and " skipped" not in line:
            stamp = line[:23]
            try:
                return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:23]) / 1000.0
            except ValueError:
                return None
    return None


def run_cli(scenario: str, command: list[str], archive: bool, scratch: Path, tree: Path = ROOT) -> dict[str, Any]:
    marks_file = scratch / f"marks-{time.monotonic_ns()}.jsonl"
    env = _environment(archive, marks_file)
    if tree != ROOT:  # another checkout's code, in the job and in every Python process Spark starts
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    load = load_average()
    started = time.time()
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S,
                            check=False)
    ended = time.time()
    if result.returncode != 0:
        raise RuntimeError(f"{scenario} failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-4000:]}")
    lines = ([json.loads(line) for line in marks_file.read_text().splitlines() if line.strip()]
             if marks_file.exists() else [])
    marks: dict[str, float] = {"start": started, "exit": ended}
    details: dict[str, dict[str, Any]] = {}
    processes: dict[str, set[int]] = {}
    for line in lines:
        name = line["mark"]
        processes.setdefault(name, set()).add(line["pid"])
        if name not in marks:  # the first of each (several reader processes mark their first read)
            marks[name] = line["t"]
            details[name] = line
        if "jvm_start" in line and "jvm_start" not in marks:
            marks["jvm_start"] = line["jvm_start"]
    run: dict[str, Any] = {"scenario": scenario, "archive": archive, "load": load, "total": ended - started,
                           "phases": _phases(CLI_PHASES, marks),
                           "warnings": _jvm_warnings(result.stdout + result.stderr),
                           "python_processes": {k: len(v) for k, v in processes.items()},
                           "batches": [line for line in result.stdout.splitlines() if line.startswith("[batch")]}
    logged = _first_merge_logged(result.stderr)
    if "merge_committed" not in marks and logged is not None:
        marks["merge_committed"] = logged
    if "merge_committed" in marks:
        run["to_first_merge"] = marks["merge_committed"] - started
        run["sink_duration_ms"] = (details.get("merge_committed", {}).get("sink") or {}).get("durationMs")
    jvm = {name: {k: details[name].get(k)
                  for k in ("jvm_classes", "jit_ms", "jvm_cpu_s", "jvm_threads_cpu_s", "python_cpu_s")}
           for name in ("session_ready", "query_started", "batch_start", "merge_committed", "query_terminated")
           if name in details and "jvm_classes" in details[name]}
    run["jvm"] = jvm
    # Every mark of every process, in seconds from the start: the driver, the planner processes, the executors.
    run["timeline"] = [(round(line["t"] - started, 3), line["mark"], line["pid"],
                        None if line.get("process_started") is None else round(line["process_started"] - started, 3),
                        line.get("process_cpu_s")) for line in sorted(lines, key=lambda item: item["t"])]
    progress = (details.get("query_terminated") or {}).get("progress") or []
    run["trigger_duration_ms"] = [json.loads(p).get("durationMs") for p in progress]
    return run


def _phases(spec: Iterable[tuple[str, str, str]], marks: dict[str, float]) -> dict[str, float | None]:
    return {name: (marks[end] - marks[begin]) if begin in marks and end in marks else None
            for name, begin, end in spec}


# ----------------------------------------------------------------------------- records


def produce(broker: Any, topic: str, seed: int, count: int) -> None:
    from jobs import cdc_generator

    records, _ = cdc_generator.generate("orders", count, max(2, count // 2), seed=seed, malformed=False)
    broker.produce(topic, [(r.key, r.value) for r in records[:count]])


# ----------------------------------------------------------------------------- report


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}"


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_scenario.setdefault(run["label"], []).append(run)
    bare = _median([r["total"] for r in by_scenario.get("bare", [])])
    summary: dict[str, Any] = {}
    for label, group in by_scenario.items():
        total = _median([r["total"] for r in group])
        first_merge = _median([r.get("to_first_merge") for r in group])
        phases = {name: _median([r["phases"].get(name) for r in group]) for name in group[0]["phases"]}
        summary[label] = {
            "runs": len(group), "total_s": total, "totals": [round(r["total"], 2) for r in group],
            "to_first_merge_s": first_merge, "phases_s": phases,
            "load": [r["load"][0] for r in group],
            "total_vs_bare": (total / bare) if bare and total else None,
            "first_merge_vs_bare": (first_merge / bare) if bare and first_merge else None,
        }
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print("\nMedians (seconds); x bare = total (or first MERGE) over bare's total")
    for label, entry in summary.items():
        ratio = f"{entry['total_vs_bare']:.2f}x bare" if entry["total_vs_bare"] else ""
        first = ""
        if entry["to_first_merge_s"] is not None:
            first = f", first MERGE at {entry['to_first_merge_s']:.2f} ({entry['first_merge_vs_bare']:.2f}x bare)"
        print(f"\n{label}: total {_fmt(entry['total_s'])} {ratio}{first}  "
              f"[runs {entry['totals']}, load {entry['load']}]")
        for name, value in entry["phases_s"].items():
            print(f"    {_fmt(value)}  {name}")


# ----------------------------------------------------------------------------- main


def ensure_archive(broker: Any, scratch: Path) -> float | None:
    """Build the CLI's class archive if it is missing (one CLI run with the archive on); its time."""
    from streaming_merge.spark import class_archive as _class_archive

    option, build = _class_archive.prepare({}, "")
    if build is not None:
        build.abandon()
    elif option is not None:
        return None
    else:
        print("another process is building the class archive: the archive variants may run without it")
        return None
    topic = f"startup-build-{time.time_ns()}"
    broker.create_topic(topic, 1)
    produce(broker, topic, 99, 20)
    work = scratch / "build"
    started = time.time()
    run_cli("build", cli_command(broker.bootstrap_servers, topic, work), True, scratch)
    elapsed = time.time() - started
    option, build = _class_archive.prepare({}, "")
    if build is not None:
        build.abandon()
        raise RuntimeError("the CLI's run did not build the class archive")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians over them)")
    parser.add_argument("--variants", default="archive:auto,archive:late-c2,plain:tiered",
                        help="CLI variants ARCHIVE:JIT, ARCHIVE archive|plain, JIT the CLI's --jit "
                        "(auto: c1 here, the runs are --available-now; late-c2 is what a run that goes on gets)")
    parser.add_argument("--before", default=None, help="also the CLI of the checkout in this folder ('before')")
    parser.add_argument("--before-variant", default=None, help="ARCHIVE:JIT for 'before' (default: no archive and "
                        "its own --jit default, for a checkout older than both); the same as a --variants entry "
                        "makes an A/B of one change")
    parser.add_argument("--records", type=int, default=20, help="records per topic and per restart")
    parser.add_argument("--idle", action="store_true", help="also the CLI on the checkpoint with nothing new")
    parser.add_argument("--no-bare-archive", action="store_true", help="skip bare+archive")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--probe-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--archive-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_bare:
        probe_bare(args.archive_probe)
        return 0
    def variant(item: str, option: str) -> tuple[bool, list[str]]:
        archive_mode, _, jit = item.partition(":")
        if archive_mode not in ("archive", "plain") or jit not in ("auto", "late-c2", "tiered", "c1"):
            parser.error(f"{option}: {item!r} is not ARCHIVE:JIT (archive|plain : auto|late-c2|tiered|c1)")
        return archive_mode == "archive", ["--jit", jit]

    variants: list[tuple[str, bool, list[str], Path]] = []  # (name, archive, extra CLI args, checkout)
    for item in filter(None, (v.strip() for v in args.variants.split(","))):
        archive, extra = variant(item, "--variants")
        variants.append((item.replace(":", ", "), archive, extra, ROOT))
    if args.before:
        archive, extra = variant(args.before_variant, "--before-variant") if args.before_variant else (False, [])
        variants.append((f"before, {args.before_variant}" if args.before_variant else "before", archive, extra,
                         Path(args.before).resolve()))
    from streaming_merge.kafka.broker import EmbeddedKafka

    scratch = Path(tempfile.mkdtemp(prefix="startup_bench_"))
    runs: list[dict[str, Any]] = []
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                              "load_before": load_average(), "args": vars(args)}
    try:
        with EmbeddedKafka() as broker:
            bootstrap = broker.bootstrap_servers
            if any(archive for _, archive, _, _ in variants) or not args.no_bare_archive:
                built = ensure_archive(broker, scratch)
                report["archive_build_s"] = built
                if built is not None:
                    print(f"built the class archive in a CLI run of {built:.1f}s (before the rounds)")
            for round_index in range(args.repeat):
                steps: list[tuple[str, Any]] = [("bare", False)]
                if not args.no_bare_archive:
                    steps.append(("bare", True))
                steps += [("cli", variant) for variant in variants]
                shift = round_index % len(steps)
                for kind, option in steps[shift:] + steps[:shift]:
                    if kind == "bare":
                        run = run_bare(option)
                        run["label"] = run["scenario"]
                        runs.append(run)
                        _progress(run)
                        continue
                    name, archive, extra, tree = option
                    topic = f"startup-{round_index}-{time.time_ns()}"
                    broker.create_topic(topic, 1)
                    produce(broker, topic, 1 + round_index, args.records)
                    command = cli_command(bootstrap, topic, scratch / topic, extra)
                    for scenario in ("cli-fresh", "cli-restart", "cli-idle"):
                        if scenario == "cli-idle" and not args.idle:
                            continue
                        if scenario == "cli-restart":
                            produce(broker, topic, 100 + round_index, args.records)
                        run = run_cli(scenario, command, archive, scratch, tree)
                        run["label"] = f"{scenario} ({name})"
                        runs.append(run)
                        _progress(run)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(runs)
    print_summary(summary)
    report.update(load_after=load_average(), summary=summary, runs=runs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwritten to {out}")
    return 0


def _progress(run: dict[str, Any]) -> None:
    first = f" first MERGE {run['to_first_merge']:.2f}s" if run.get("to_first_merge") else ""
    warnings = f" JVM warnings: {run['warnings']}" if run.get("warnings") else ""
    print(f"  {run['label']:<34} {run['total']:6.2f}s{first} (load {run['load'][0]}){warnings}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
