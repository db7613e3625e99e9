"""Lists of longs gathered by an observation (``DataFrame.observe``), read back cheaply.

A MERGE or UPDATE with deletion vectors observes one long per changed row (a packed position, a
source row id): tens of thousands a job. Two costs are easy to pay by accident:

- Spark's scheduler reads a named accumulator's value after every task, for the UI: an
  observation whose final expression builds a text (``concat_ws``, ``to_json``) of the whole
  list builds it once per task, on the scheduler's thread, partly on the job's critical path.
  Kept a plain ``collect_list``, that value is an array copy.
- PySpark's ``Observation.get`` pickles the row into a byte array that py4j decodes a byte at
  a time in Python. Read field by field instead (through PySpark's private handle on the JVM's
  Observation), each list joined into one text in the JVM, it crosses as one string.
  bench/private_apis.md has the measured gain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark.sql import Column, Observation, SparkSession
from pyspark.sql import functions as F

from streaming_merge.spark.jvm import jvm_class

log = logging.getLogger(__name__)


def long_list(column: Column) -> Column:
    """The observed rows' non-NULL values of a long column, as a list (read by observed_row)."""
    return F.collect_list(column)


def observed_row(spark: SparkSession, observation: Observation, is_list: Callable[[str], bool]) -> dict[str, Any]:
    """The observation's values by name, the fields ``is_list`` names (long_list's) as texts
    (see longs). Empty when the observation never arrived (Spark proved the observed subtree
    empty and dropped it)."""
    # PySpark's own handle on the JVM's Observation, read outside the ``try``: a PySpark that
    # renames it fails here, loudly, not as an observation that never arrived.
    handle = observation._jo
    try:
        row = handle.getRow()  # type: ignore[union-attr]
    except Exception as exc:  # Py4JJavaError: the metrics row never arrived
        log.debug("Observation %s not reported (subtree optimized away as empty): %s", observation, exc)
        return {}
    join = jvm_class(spark, "org.apache.commons.lang3.StringUtils").join
    return {name: join(row.getList(i), ",") if is_list(name) else row.get(i)
            for i, name in enumerate(row.schema().fieldNames())}


def longs(text: object) -> np.ndarray:
    """The longs of an observed list's text (see observed_row); none for a missing one."""
    return np.fromstring(str(text), dtype=np.int64, sep=",") if text else np.zeros(0, dtype=np.int64)
