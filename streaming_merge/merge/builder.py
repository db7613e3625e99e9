"""The ``DeltaTable.merge(...)`` builder, with delta-spark's method names.

Each ``when...`` call returns a new builder (the builder is immutable), so a partly
built merge can be reused as a template, e.g. by the streaming sink per batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame

from streaming_merge.errors import InvalidArgumentError, InvalidArgumentTypeError
from streaming_merge.merge.clauses import ClauseAction, ClauseKind, ExprLike, MergeClause, to_column
from streaming_merge.merge.command import MergeOptions, MergeRequest, run_merge
from streaming_merge.merge.metrics import MergeMetrics
from streaming_merge.table.location import TableHandle

DEFAULT_SOURCE_ALIAS = "source"


def source_alias_of(source: DataFrame) -> str | None:
    """The alias given with ``df.alias(...)``, read from the analysed plan's top node."""
    plan = source._jdf.queryExecution().analyzed()
    if str(plan.getClass().getSimpleName()) == "SubqueryAlias":
        return str(plan.alias())
    return None


@dataclasses.dataclass(frozen=True)
class DeltaMergeBuilder:
    """Builder of one MERGE; ``execute()`` runs it."""

    table: TableHandle
    source: DataFrame
    condition: Column
    clauses: tuple[MergeClause, ...] = ()
    schema_evolution: bool = False
    options: MergeOptions = dataclasses.field(default_factory=MergeOptions)

    def _add(self, kind: ClauseKind, action: ClauseAction, condition: ExprLike | None,
             assignments: Mapping[str, ExprLike] | None = None) -> DeltaMergeBuilder:
        if assignments is not None and not isinstance(assignments, Mapping):
            raise InvalidArgumentTypeError(f"Assignments must be a dict of column name to SQL string or Column, got "
                            f"{type(assignments).__name__}")
        clause = MergeClause(kind, action, condition, dict(assignments or {}))
        return dataclasses.replace(self, clauses=(*self.clauses, clause))

    def whenMatchedUpdate(self, condition: ExprLike | None = None,
                          set: Mapping[str, ExprLike] | None = None) -> DeltaMergeBuilder:
        if not set:
            raise InvalidArgumentError(
                "whenMatchedUpdate needs set={column: value, ...}; use whenMatchedUpdateAll for *")
        return self._add("matched", "update", condition, set)

    def whenMatchedUpdateAll(self, condition: ExprLike | None = None) -> DeltaMergeBuilder:
        return self._add("matched", "update_all", condition)

    def whenMatchedDelete(self, condition: ExprLike | None = None) -> DeltaMergeBuilder:
        return self._add("matched", "delete", condition)

    def whenNotMatchedInsert(self, condition: ExprLike | None = None,
                             values: Mapping[str, ExprLike] | None = None) -> DeltaMergeBuilder:
        if not values:
            raise InvalidArgumentError("whenNotMatchedInsert needs values={column: value, ...}; use "
                             "whenNotMatchedInsertAll for *")
        return self._add("not_matched", "insert", condition, values)

    def whenNotMatchedInsertAll(self, condition: ExprLike | None = None) -> DeltaMergeBuilder:
        return self._add("not_matched", "insert_all", condition)

    def whenNotMatchedBySourceUpdate(self, condition: ExprLike | None = None,
                                     set: Mapping[str, ExprLike] | None = None) -> DeltaMergeBuilder:
        if not set:
            raise InvalidArgumentError("whenNotMatchedBySourceUpdate needs set={column: value, ...}")
        return self._add("not_matched_by_source", "update", condition, set)

    def whenNotMatchedBySourceDelete(self, condition: ExprLike | None = None) -> DeltaMergeBuilder:
        return self._add("not_matched_by_source", "delete", condition)

    def withSchemaEvolution(self) -> DeltaMergeBuilder:
        """Let ``UPDATE SET *`` / ``INSERT *`` add the source's new top-level columns."""
        return dataclasses.replace(self, schema_evolution=True)

    def withOptions(self, **options: object) -> DeltaMergeBuilder:
        """Override MergeOptions fields (materialize_source, storage_levels, max_attempts, ...)."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **options))  # type: ignore[arg-type]

    def execute(self, app_id: str | None = None, version: int | None = None) -> MergeMetrics:
        """Run the MERGE. With ``app_id`` and ``version`` it is idempotent: skipped (and
        reported with ``skipped=True``) when the table already holds txn(app_id) >= version."""
        if (app_id is None) != (version is None):
            raise InvalidArgumentError("Pass app_id and version together (both or neither) for an idempotent MERGE.")
        if version is not None and version < 0:
            raise InvalidArgumentError(f"version must be >= 0, got {version}")
        spark = self.source.sparkSession
        return run_merge(spark, MergeRequest(
            table_path=self.table.location,
            source=self.source,
            source_alias=source_alias_of(self.source) or DEFAULT_SOURCE_ALIAS,
            target_alias=self.table.alias_name,
            condition=to_column(self.condition),
            clauses=self.clauses,
            schema_evolution=self.schema_evolution,
            options=self.options,
            app_id=app_id,
            app_version=version,
            condition_text=self.condition if isinstance(self.condition, str) else None,
        ))
