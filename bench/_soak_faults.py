"""The soak's faults of a real deployment besides its process kills (bench/soak.py): Apache
Kafka SIGKILLed and restarted, Delta Lake's own writer on the target table, and the job's
local disk (``spark.local.dir``) filling up. Each fault is planned up front with the soak's
seeded RNG ("at batch B": the first time a batch >= B starts in a life, after a random delay)
and fired from the soak's process while a life runs, wherever that lands.

- ``broker_restart``: SIGKILL of the broker's JVM (no controlled shutdown), down for a random
  while, then restarted on the same log directory and port (devtools/kafka_server.py). The job
  may ride it out or fail; a failed life is restarted like a killed one.
- ``delta_merge`` / ``delta_optimize``: a command to the Delta Lake writer
  (bench/_soak_delta_writer.py, delta-spark in a process of its own): a MERGE of keys the
  stream never uses, or OPTIMIZE. It runs beside the job's batches; both sides must retry
  their conflicts and lose no commit.
- ``disk_full``: the job's ``spark.local.dir`` is a small tmpfs; a ballast file fills it for a
  random while (at most until the life ends), so shuffle and block writes fail with ENOSPC.
- ``s3_error`` / ``s3_throttle`` / ``s3_slow_put`` / ``s3_lost_answer`` (``--storage s3``: the
  tables on ``s3a://`` in moto, the job reaching it through devtools/s3_faults.py's proxy): the
  proxy is armed for the next PUT of a commit file (``_delta_log/N.json``) or of a data file
  (the seeded draw picks which), which then gets 500 InternalError (1-3 times in a row), 503
  SlowDown (1-3 times), a delay of 1 s + 0-1.5 median batches, or (commit files only) lands
  while its answer is dropped: the put-if-absent's retry must see that its own commit landed.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools.kafka_server import ApacheKafka
from devtools.s3_faults import Fault, FaultProxy

S3_FAULT_KINDS = ("s3_error", "s3_throttle", "s3_slow_put", "s3_lost_answer")
FAULT_KINDS = ("broker_restart", "delta_merge", "delta_optimize", "disk_full", *S3_FAULT_KINDS)
# Faults that make a life fail without a kill of ours: such a life is restarted, not a failure.
DISRUPTIVE_KINDS = ("broker_restart", "disk_full", *S3_FAULT_KINDS)
# The proxy's request paths (path-style: /bucket/table/...): a commit file, a data file.
COMMIT_PUT = r"/_delta_log/\d{20}\.json$"
DATA_PUT = r"\.parquet$"
WRITER_READY_TIMEOUT_S = 300.0  # a guard: the writer's JVM with Delta's jar, on a loaded machine
WRITER_FINISH_TIMEOUT_S = 600.0
BALLAST = "ballast"
MIN_BALLAST_STEP = 4096  # a tmpfs page


@dataclass
class FaultPlan:
    """One fault: KIND once a batch >= ``batch`` starts, ``delay_fraction`` of the soak's delay
    scale later; ``hold_fraction`` scales how long the broker stays down / the disk stays full."""

    index: int
    kind: str
    batch: int
    delay_fraction: float
    hold_fraction: float


def make_fault_plan(rng: random.Random, counts: dict[str, int], batches: int) -> list[FaultPlan]:
    """Faults at random batches of the first 75 % of the stream, so that each fires before the
    stream ends even when the lives around it are killed early."""
    span = max(1, int(batches * 0.75))
    drawn = [(rng.randrange(span), kind, rng.random(), rng.random())
             for kind in FAULT_KINDS for _ in range(counts.get(kind, 0))]
    drawn.sort(key=lambda d: (d[0], d[1]))
    return [FaultPlan(i, kind, batch, delay, hold) for i, (batch, kind, delay, hold) in enumerate(drawn)]


# ------------------------------------------------------------------ the local disk


class LocalDisk:
    """A tmpfs of ``size_mb`` at ``path``, the job's ``spark.local.dir``; unmounted by
    :meth:`unmount`, and at exit if the soak dies before."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.mounted = False
        self.ballast = path / BALLAST

    def mount(self) -> LocalDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)], check=True)
        self.mounted = True
        atexit.register(self.unmount)
        return self

    def fill(self) -> int:
        """A ballast file takes every free byte; returns its size. Grown in halving steps to
        ENOSPC: the job writes meanwhile, so no size measured before would be exact."""
        size, step = 0, 1 << 20
        with open(self.ballast, "wb") as handle:
            while step >= MIN_BALLAST_STEP:
                try:
                    os.posix_fallocate(handle.fileno(), size, step)
                    size += step
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    step //= 2
        return size

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def used_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def clear(self) -> None:
        """Between lives: a killed job leaves its block-manager and shuffle folders behind
        (Spark removes them only at a clean exit); a real node's scratch disk goes with the
        container. Kept, a hundred dead lives would fill the disk with no fault of ours."""
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False


# ------------------------------------------------------------------ Delta Lake's writer


class DeltaWriter:
    """The delta-spark writer process (bench/_soak_delta_writer.py) and its command folder."""

    def __init__(self, workdir: Path, target: Path) -> None:
        self.folder = workdir / "delta_writer"
        self.target = target
        self.sent = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "delta_writer.log"

    def start(self) -> DeltaWriter:
        self.folder.mkdir(parents=True, exist_ok=True)
        ready = self.folder / "ready"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench._soak_delta_writer", "--target", str(self.target),
                 "--commands", str(self.folder), "--ready", str(ready)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        atexit.register(self.kill)
        deadline = time.monotonic() + WRITER_READY_TIMEOUT_S
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Delta writer did not start: {self.log_tail()}")
            time.sleep(0.2)
        return self

    def send(self, kind: str, index: int) -> int:
        """Queue a command; returns its number (the writer runs them in order)."""
        number = self.sent
        partial = self.folder / f"{number:05d}.partial"
        partial.write_text(json.dumps({"kind": kind, "index": index}))
        partial.replace(self.folder / f"{number:05d}.json")
        self.sent += 1
        return number

    def outcomes(self) -> list[dict[str, Any]]:
        return [json.loads((self.folder / f"{n:05d}.done.json").read_text()) for n in range(self.sent)
                if (self.folder / f"{n:05d}.done.json").exists()]

    def finish(self) -> list[dict[str, Any]]:
        """Wait for every command's outcome, then stop the writer."""
        deadline = time.monotonic() + WRITER_FINISH_TIMEOUT_S
        assert self.process is not None
        while len(self.outcomes()) < self.sent and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        (self.folder / "stop").touch()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.outcomes()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait()

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:]) if self.log_path.exists() else ""


# ------------------------------------------------------------------ firing them


@dataclass
class Armed:
    plan: FaultPlan
    fire_at: float


@dataclass
class Faults:
    """Fires the planned faults while a life runs (:meth:`poll`, from the soak's life loop) and
    ends what a life's end must end (:meth:`end_of_life`)."""

    plan: list[FaultPlan]
    delay_scale_s: Callable[[], float]
    broker: ApacheKafka | None = None
    writer: DeltaWriter | None = None
    disk: LocalDisk | None = None
    target: Path | None = None
    proxy: FaultProxy | None = None
    pending: list[FaultPlan] = field(default_factory=list)
    armed: list[Armed] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    _broker_thread: threading.Thread | None = None
    _disk_until: float | None = None
    _disk_record: dict[str, Any] | None = None
    _s3_armed: list[tuple[Fault, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pending = list(self.plan)

    def poll(self, life: int, latest_batch: int | None) -> list[dict[str, Any]]:
        """Arm the faults whose batch has started in this life, fire the armed ones that are
        due; returns the records of the faults fired now."""
        now = time.monotonic()
        fired = []
        if latest_batch is not None:
            for plan in [p for p in self.pending if p.batch <= latest_batch]:
                self.pending.remove(plan)
                self.armed.append(Armed(plan, now + plan.delay_fraction * self.delay_scale_s()))
        for armed in sorted(self.armed, key=lambda a: a.fire_at):
            if now >= armed.fire_at and self._can_fire(armed.plan.kind):
                self.armed.remove(armed)
                record = self._fire(armed.plan, life, latest_batch)
                self.records.append(record)
                fired.append(record)
        if self._disk_until is not None and now >= self._disk_until:
            self._release_disk()
        return fired

    def _can_fire(self, kind: str) -> bool:
        if kind == "broker_restart":
            return self._broker_thread is None or not self._broker_thread.is_alive()
        if kind == "disk_full":
            return self._disk_until is None
        if kind in S3_FAULT_KINDS:  # one proxy fault at a time: each one's hit is then its own
            return not any(fault.times > 0 for fault, _ in self._s3_armed)
        # Delta's commands need the table, which the job's first MERGE creates.
        return self.target is not None and (self.target / "_delta_log").exists()

    def _fire(self, plan: FaultPlan, life: int, batch: int | None) -> dict[str, Any]:
        record: dict[str, Any] = {**asdict(plan), "life": life, "batchWhenFired": batch, "t": time.time()}
        if plan.kind == "broker_restart":
            assert self.broker is not None
            down_s = 1.0 + plan.hold_fraction * self.delay_scale_s()
            record["downForS"] = round(down_s, 2)
            self._broker_thread = threading.Thread(target=self._restart_broker, args=(down_s, record),
                                                   name="soak-broker-restart", daemon=True)
            self._broker_thread.start()
        elif plan.kind == "disk_full":
            assert self.disk is not None
            record["usedBeforeBytes"] = self.disk.used_bytes()
            record["ballastBytes"] = self.disk.fill()
            hold_s = 1.0 + plan.hold_fraction * 2 * self.delay_scale_s()
            record["heldForAtMostS"] = round(hold_s, 2)
            self._disk_until = time.monotonic() + hold_s
            self._disk_record = record
        elif plan.kind in S3_FAULT_KINDS:
            self._arm_s3(plan, record)
        else:
            assert self.writer is not None
            record["command"] = self.writer.send(plan.kind.removeprefix("delta_"), plan.index)
        return record

    def _arm_s3(self, plan: FaultPlan, record: dict[str, Any]) -> None:
        """Arm the proxy for the next PUT of a commit file or (``hold_fraction`` >= 0.5, not for
        a lost answer) of a data file; it fires when the job makes that request."""
        assert self.proxy is not None
        on_data = plan.hold_fraction >= 0.5 and plan.kind != "s3_lost_answer"
        path = DATA_PUT if on_data else COMMIT_PUT
        times = 1 + int(plan.delay_fraction * 3) if plan.kind in ("s3_error", "s3_throttle") else 1
        if plan.kind == "s3_slow_put":
            fault = Fault("delay", "PUT", path, seconds=round(1.0 + plan.hold_fraction * self.delay_scale_s(), 2))
        elif plan.kind == "s3_lost_answer":
            fault = Fault("drop_after_forward", "PUT", path)
        else:
            fault = Fault("status", "PUT", path, times=times, status=500 if plan.kind == "s3_error" else 503)
        record.update({"on": "data file" if on_data else "commit file", "times": fault.times,
                       "seconds": fault.seconds, "status": fault.status if fault.kind == "status" else None})
        self.proxy.arm(fault)
        self._s3_armed.append((fault, record))

    def s3_hits(self) -> None:
        """Note in each S3 fault's record the requests it acted on (its hits are the proxy's, in order)."""
        if self.proxy is None:
            return
        hits = self.proxy.hits()
        for fault, record in self._s3_armed:
            if "disarmedAfter" not in record:
                record["hitTimes"] = record["times"] - fault.times
        # The proxy's hits carry no fault id; one fault is armed at a time, so they come in order.
        position = 0
        for _, record in self._s3_armed:
            taken = record["hitTimes"]
            record["hits"] = [{"path": h.path, "upstreamStatus": h.upstream_status}
                              for h in hits[position:position + taken]]
            position += taken

    def _restart_broker(self, down_s: float, record: dict[str, Any]) -> None:
        assert self.broker is not None
        self.broker.kill()
        time.sleep(down_s)  # the outage itself: the broker stays dead this long
        started = time.monotonic()
        try:
            self.broker.restart()
            record["restartS"] = round(time.monotonic() - started, 2)
        except Exception as exc:  # the soak fails its verdict on a broker that never came back
            record["restartError"] = f"{type(exc).__name__}: {exc}"[:2000]

    def _release_disk(self) -> None:
        assert self.disk is not None
        self.disk.release()
        if self._disk_record is not None:
            self._disk_record["releasedAfterS"] = round(time.time() - self._disk_record["t"], 2)
        self._disk_until, self._disk_record = None, None

    def end_of_life(self) -> None:
        """The life's processes are gone: the disk is emptied (ballast and the dead life's
        folders), the broker is back up before the next life starts, and the faults armed but
        not fired wait for the next life's batches again."""
        if self._disk_until is not None:
            self._release_disk()
        if self.disk is not None:
            self.disk.clear()
        if self._broker_thread is not None:
            self._broker_thread.join()
        self._disarm_s3()
        self.pending = sorted([*self.pending, *(a.plan for a in self.armed)], key=lambda p: p.index)
        self.armed = []

    def _disarm_s3(self) -> None:
        """An S3 fault no request of the dead life hit waits for the next life's batches like the
        others (its record is dropped: it fires again); one hit fewer times than armed is
        disarmed (the client gave up retrying, the rest would hit another life)."""
        for fault, record in list(self._s3_armed):
            if fault.times <= 0:
                continue
            hit = record["times"] - fault.times
            fault.times = 0  # the proxy skips it from now on
            if hit == 0:
                record["rearmedInALaterLife"] = True
                self._s3_armed.remove((fault, record))
                self.records.remove(record)
                self.pending.append(FaultPlan(**{k: record[k] for k in
                                                 ("index", "kind", "batch", "delay_fraction", "hold_fraction")}))
            else:
                record["hitTimes"], record["disarmedAfter"] = hit, hit

    def not_delivered(self) -> list[str]:
        self.s3_hits()
        return ([f"{p.kind}@{p.batch}" for p in self.pending + [a.plan for a in self.armed]]
                + [f"{r['kind']}@{r['batch']} armed, no request hit it"
                   for _, r in self._s3_armed if r["hitTimes"] == 0])
