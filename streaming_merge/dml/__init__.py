"""DELETE and UPDATE: delta-spark's ``DeltaTable.delete`` / ``DeltaTable.update`` on Spark.

A table with ``delta.enableDeletionVectors=true`` is changed merge-on-read (the deleted or
updated rows' positions go into their files' deletion vectors, only updated rows are written);
any other table copy-on-write (the touched files are rewritten). Both return Delta's metrics.
"""

from streaming_merge.dml._common import DmlMetrics
from streaming_merge.dml.delete import run_delete
from streaming_merge.dml.update import run_update

__all__ = ["DmlMetrics", "run_delete", "run_update"]
