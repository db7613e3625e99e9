"""The local session's settings that depend on the master, without a JVM."""

from __future__ import annotations

from streaming_merge import session


def test_local_masters_use_the_raw_local_file_system_and_file_system_checkpoint_logs() -> None:
    for master in ("local[2]", "local", " LOCAL-cluster[2,1,1024]"):
        assert session._local_files_conf(master) == {
            "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
            "spark.sql.streaming.checkpointFileManagerClass":
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"}


def test_cluster_masters_keep_sparks_file_settings() -> None:
    for master in ("yarn", "spark://host:7077", "k8s://https://api:6443"):
        assert session._local_files_conf(master) == {}
