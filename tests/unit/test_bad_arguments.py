"""The public API refuses bad arguments with errors of ours that are also the builtin classes
Python users catch: every one derives from StreamingMergeError, a bad value is a ValueError.
Each case names the argument and what is accepted (docs/reference/errors.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import streaming_merge as sm
from streaming_merge.errors import InvalidArgumentError, StorageOptionError, StreamingMergeError
from streaming_merge.table.location import resolve

CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "a sink without keys or condition": (lambda: sm.MergeSink("/lake/t"), InvalidArgumentError,
                                         r"keys=\[\.\.\.\] or condition="),
    "an empty target": (lambda: sm.MergeSink(" ", keys=["id"]), InvalidArgumentError, "target table path"),
    "a key that is no column name": (lambda: sm.MergeSink("/lake/t", keys=[1]), InvalidArgumentError,
                                     "keys takes column names"),
    "no attempts": (lambda: sm.MergeSink("/lake/t", keys=["id"], max_attempts=0), InvalidArgumentError,
                    "max_attempts must be >= 1, got 0"),
    "a backoff whose cap is below its start": (
        lambda: sm.MergeSink("/lake/t", keys=["id"], conflict_backoff=(2.0, 1.0)), InvalidArgumentError,
        r"conflict_backoff .* got \(2.0, 1.0\)"),
    "SCD 3": (lambda: sm.MergeSink("/lake/t", keys=["id"], sequence_by="lsn", stored_as_scd_type=3),
              InvalidArgumentError, "stored_as_scd_type must be 1 or 2"),
    "SCD 2 without a sequence": (lambda: sm.MergeSink("/lake/t", keys=["id"], stored_as_scd_type=2),
                                 InvalidArgumentError, "needs keys=.* and sequence_by"),
    "a misspelt storage option, at construction": (
        lambda: sm.MergeSink("s3a://lake/t", keys=["id"], storage_options={"AWS_ENDPONT_URL": "http://m:9000"}),
        StorageOptionError, "did you mean `AWS_ENDPOINT_URL`"),
    "a file size of zero": (lambda: sm.MergeOptions(target_file_size=0), InvalidArgumentError,
                            "target_file_size must be a positive number of bytes, got 0"),
    "a compaction target below zero": (lambda: sm.OptimizeOptions(target_file_size=-1), InvalidArgumentError,
                                       "target_file_size must be a positive number of bytes, got -1"),
    "an empty location": (lambda: resolve("  "), InvalidArgumentError, "non-empty path or URI"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_raise_our_error_which_is_also_a_value_error(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", staticmethod(lambda: None))
    call, error, message = CASES[case]
    with pytest.raises(error, match=message) as raised:
        call()
    assert isinstance(raised.value, StreamingMergeError) and isinstance(raised.value, ValueError)
