"""Create a Delta table from a Spark DataFrame in one commit (protocol, metadata, adds)."""

from __future__ import annotations

from collections.abc import Mapping

from deltalake.exceptions import DeltaError
from deltalake.schema import Schema as RsSchema
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from streaming_merge.errors import DeltaTableError
from streaming_merge.table.location import TableRef, resolve
from streaming_merge.table.schema import check_partition_columns, spark_to_delta_json
from streaming_merge.table.snapshot import table_exists
from streaming_merge.table.write import delete_written, write_files


def create_table(
    spark: SparkSession,
    df: DataFrame,
    path: TableRef,
    partition_by: list[str] | None = None,
    *,
    schema: StructType | None = None,
    properties: Mapping[str, str] | None = None,
) -> None:
    """Create the table at ``path`` holding ``df``'s rows; refuse an existing table.

    ``properties`` are table properties (``delta.enableDeletionVectors``, ...); delta-rs gives
    the table the protocol they need (reader 3 / writer 7 with ``deletionVectors``)."""
    location = resolve(path, spark)
    partition_columns = list(partition_by or [])
    schema = schema or df.schema
    check_partition_columns(schema, partition_columns)
    if table_exists(location):
        raise DeltaTableError(f"A Delta table already exists at `{location}`; refusing to overwrite it.")
    written = write_files(spark, df.select(*[f"`{f.name}`" for f in schema.fields]), location, schema,
                          partition_columns)
    try:
        create_table_with_add_actions(
            location.log_uri,
            RsSchema.from_json(spark_to_delta_json(schema)),
            [
                AddAction(w.path, w.size, w.partition_values, w.modification_time, True, w.stats)
                for w in written
            ],
            mode="error",
            partition_by=partition_columns or None,
            configuration=dict(properties) if properties else None,
            storage_options=location.options,
            commit_properties=CommitProperties(custom_metadata={"userOperation": "CREATE TABLE AS SELECT"}),
        )
    except DeltaError as exc:
        delete_written(spark, location, written)
        raise DeltaTableError(f"Creating the Delta table at `{location}` failed: {exc}") from exc
