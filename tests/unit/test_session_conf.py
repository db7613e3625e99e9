"""The local session's settings that depend on the master, without a JVM."""

from __future__ import annotations

from streaming_merge import session


def test_local_masters_write_checkpoint_logs_through_the_file_system_api() -> None:
    for master in ("local[2]", "local", " LOCAL-cluster[2,1,1024]"):
        assert session._checkpoint_conf(master) == {
            "spark.sql.streaming.checkpointFileManagerClass":
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"}


def test_cluster_masters_keep_sparks_checkpoint_manager() -> None:
    for master in ("yarn", "spark://host:7077", "k8s://https://api:6443"):
        assert session._checkpoint_conf(master) == {}
