"""The table's protocol: which reader and writer features it has, which we honour, and the
upgrade that turning deletion vectors on needs (PROTOCOL.md, "Table Features").

A table on writer version 7 lists its features; an older one implies them by its version. A
feature that asks nothing of a writer while unused (``appendOnly`` is a property we check,
``invariants`` and ``variantType`` only matter when a column uses them, which
``check_writable`` refuses) is accepted; any other is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DELETION_VECTORS = "deletionVectors"
CHANGE_DATA_FEED = "changeDataFeed"
# The legacy writer version that brings change data feed (and, with it, generated columns).
CHANGE_DATA_FEED_WRITER_VERSION = 4
FEATURES_READER_VERSION = 3
FEATURES_WRITER_VERSION = 7

# Reader and writer features we keep correct. checkConstraints and generatedColumns come with
# writer version 4 (change data feed): they ask nothing while no constraint or generated column
# exists, and check_writable refuses a table that has one.
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz", DELETION_VECTORS, "variantType", "variantType-preview"})
SUPPORTED_WRITER_FEATURES = frozenset({"appendOnly", "timestampNtz", "invariants", DELETION_VECTORS, "variantType",
                                       "variantType-preview", CHANGE_DATA_FEED, "checkConstraints",
                                       "generatedColumns"})

# The writer features a legacy writer version implies (PROTOCOL.md, "Table Features for New and
# Existing Tables"); reader version 2 implies column mapping.
_IMPLIED_WRITER_FEATURES = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}


@dataclass(frozen=True)
class Protocol:
    """A ``protocol`` action."""

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    @classmethod
    def of(cls, protocol: Any) -> Protocol:
        """From delta-rs' ``ProtocolVersions`` (or anything with the same attributes)."""
        if isinstance(protocol, Protocol):
            return protocol
        readers = getattr(protocol, "reader_features", None)
        writers = getattr(protocol, "writer_features", None)
        return cls(int(protocol.min_reader_version), int(protocol.min_writer_version),
                   tuple(readers) if readers is not None else None, tuple(writers) if writers is not None else None)

    def to_json(self) -> dict[str, Any]:
        action: dict[str, Any] = {"minReaderVersion": self.min_reader_version,
                                  "minWriterVersion": self.min_writer_version}
        if self.reader_features is not None:
            action["readerFeatures"] = list(self.reader_features)
        if self.writer_features is not None:
            action["writerFeatures"] = list(self.writer_features)
        return action

    @property
    def has_deletion_vectors(self) -> bool:
        return DELETION_VECTORS in (self.reader_features or ())

    def writer_feature_set(self) -> set[str]:
        """Every writer feature this protocol has, listed or implied by its version."""
        if self.min_writer_version >= FEATURES_WRITER_VERSION:
            return set(self.writer_features or ())
        return {f for version, names in _IMPLIED_WRITER_FEATURES.items() if self.min_writer_version >= version
                for f in names}

    def reader_feature_set(self) -> set[str]:
        if self.min_reader_version >= FEATURES_READER_VERSION:
            return set(self.reader_features or ())
        return {"columnMapping"} if self.min_reader_version >= 2 else set()

    def with_deletion_vectors(self) -> Protocol:
        """This protocol upgraded to table features with ``deletionVectors`` in both lists,
        keeping every feature its old versions implied."""
        if self.has_deletion_vectors and DELETION_VECTORS in (self.writer_features or ()):
            return self
        readers = sorted(self.reader_feature_set() | {DELETION_VECTORS})
        writers = sorted(self.writer_feature_set() | set(readers) | {DELETION_VECTORS})
        return Protocol(FEATURES_READER_VERSION, FEATURES_WRITER_VERSION, tuple(readers), tuple(writers))


    @property
    def has_change_data_feed(self) -> bool:
        return CHANGE_DATA_FEED in self.writer_feature_set()

    def with_change_data_feed(self) -> Protocol:
        """This protocol able to record change data: writer version 4 on a legacy protocol, the
        ``changeDataFeed`` writer feature on a table-features one (PROTOCOL.md, "Change Data Feed")."""
        if self.has_change_data_feed:
            return self
        if self.min_writer_version >= FEATURES_WRITER_VERSION:
            return Protocol(self.min_reader_version, self.min_writer_version, self.reader_features,
                            tuple(sorted({*(self.writer_features or ()), CHANGE_DATA_FEED})))
        return Protocol(self.min_reader_version, CHANGE_DATA_FEED_WRITER_VERSION, self.reader_features,
                        self.writer_features)

    def required_by(self, configuration: Mapping[str, str | None]) -> Protocol:
        """This protocol upgraded as far as the table properties ``configuration`` need."""
        protocol = self
        if is_enabled(configuration, "delta.enableDeletionVectors"):
            protocol = protocol.with_deletion_vectors()
        if is_enabled(configuration, "delta.enableChangeDataFeed"):
            protocol = protocol.with_change_data_feed()
        return protocol


DEFAULT_PROTOCOL = Protocol(1, 2)


def protocol_for_new_table(configuration: dict[str, str]) -> Protocol:
    """The protocol a new table with these properties needs."""
    return DEFAULT_PROTOCOL.required_by(configuration)


def is_enabled(configuration: Mapping[str, str | None] | Mapping[str, str], key: str) -> bool:
    return (configuration.get(key) or "false").strip().lower() == "true"
