"""Interpreted execution for small inputs: Spark's queries without generated code.

Spark compiles generated Java for every new plan shape (whole-stage code generation, and
per-expression projections and predicates) with Janino, then the JIT compiles those classes
again once they are hot. A compiled shape is cached, so a long-running stream pays this once
per shape; but a new query (a restart, a deploy, a demo) pays it for every query of its
first batches, on the thread that runs the batch, while the JIT competes for the same cores.
Measured on the 2-core machine (``jobs.kafka_cdc_demo``, two tables of about 300 events):
150 compilations, about 4 s of compile time; the demo caught up in 19.3-19.7 s without code
generation against 22.5-24.4 s with it. For a few thousand rows, interpreting the
expressions costs about what running the compiled code saves (5k-record batches: p50 1,583
against 1,756 ms; a 1k-row MERGE into 10k rows: the same within noise). With about 100k
rows and more, compiled code pays off, so only inputs at or below a row bound run
interpreted; the bound counts the rows the operation reads (source plus target candidates),
known before it runs from observed counts and the Delta log's per-file ``numRecords``.

Both settings are session settings read when a query is planned and, on the executors, from
the task's properties, so they hold exactly for the queries started inside the block.
``spark.sql.codegen.factoryMode`` is an internal Spark setting (its ``NO_CODEGEN`` mode is
the interpreted fallback Spark itself uses when compilation fails).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import SparkSession

from streaming_merge.spark.conf import temporary_conf

INTERPRETED_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Rows read by an operation (source plus target candidates) up to which it runs interpreted.
DEFAULT_INTERPRETED_MAX_ROWS = 20_000


def runs_interpreted(rows: int | None, max_rows: int) -> bool:
    """Whether an operation reading ``rows`` rows (None: not known in advance) runs interpreted;
    a bound of 0 turns interpreted execution off."""
    return max_rows > 0 and rows is not None and rows <= max_rows


@contextlib.contextmanager
def interpreted_if_small(spark: SparkSession, rows: int | None, max_rows: int) -> Iterator[bool]:
    """Run the block's queries interpreted when :func:`runs_interpreted`; yields whether it
    does. It never turns code generation back on, so a block inside an interpreted one stays
    interpreted."""
    if not runs_interpreted(rows, max_rows):
        yield False
        return
    with temporary_conf(spark, INTERPRETED_CONF):
        yield True


def rows_of(counts: list[int | None]) -> int | None:
    """The sum of row counts, None when any is unknown (a log entry without ``numRecords``)."""
    total = 0
    for count in counts:
        if count is None:
            return None
        total += count
    return total
