"""The Kafka CDC ingestion job's own ``main`` in a subprocess, for tests/kafka/test_graceful_stop.py,
with points the test can send SIGTERM at.

    python -m tests.streaming_support.graceful_stop_app --announce FILE [--hold PHASE:BATCH:UNTIL] -- JOB ARGS

``--announce`` receives one line per point reached: ``installed`` (the job handles SIGTERM from
then on), then ``<phase> <batch id>`` at each of the sink's phases. ``--hold`` keeps the batch at
that phase until the job's graceful stop has been asked for (``UNTIL`` = ``requested``: the test's
SIGTERM came while the batch ran) or has abandoned the batch (``abandoned``: the stop timeout
passed). Nothing in ``jobs/`` is changed: the hooks wrap GracefulStop's methods.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

import jobs.kafka_cdc_ingest as job
from jobs._graceful_stop import GracefulStop

HOLD_LIMIT_S = 300.0  # a guard against a hang, not a synchronisation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--announce", required=True)
    parser.add_argument("--hold", default=None, help="PHASE:BATCH:UNTIL, UNTIL in requested, abandoned")
    parser.add_argument("job_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    hold = args.hold.split(":") if args.hold else None
    running = threading.local()

    def announce(line: str) -> None:
        with open(args.announce, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    install, wrap, phase_hook = GracefulStop.install, GracefulStop.wrap, GracefulStop.phase_hook

    def installed(self: GracefulStop) -> None:
        install(self)
        announce("installed")

    def wrapped(self: GracefulStop, function: Any) -> Any:
        def tracked(records: Any, batch_id: int) -> None:
            running.batch = batch_id
            function(records, batch_id)
        return wrap(self, tracked)

    def held(self: GracefulStop, phase: str, frame: Any = None) -> None:
        batch = getattr(running, "batch", None)
        announce(f"{phase} {batch}")
        if hold is not None and phase == hold[0] and batch == int(hold[1]):
            event = self.requested if hold[2] == "requested" else self.abandoned
            if not event.wait(HOLD_LIMIT_S):
                raise AssertionError(f"held at {phase} of batch {batch}: the stop never came")
        phase_hook(self, phase, frame)

    GracefulStop.install = installed  # type: ignore[method-assign]
    GracefulStop.wrap = wrapped  # type: ignore[method-assign]
    GracefulStop.phase_hook = held  # type: ignore[method-assign]
    job_args = args.job_args[1:] if args.job_args[:1] == ["--"] else args.job_args
    return job.main(job_args)


if __name__ == "__main__":
    sys.exit(main())
