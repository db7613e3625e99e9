"""The local session's settings that depend on the master, and what importing the package costs a
Python worker; without the test session's JVM (one test starts a session in a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

import streaming_merge
from streaming_merge import session
from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark import given_conf


def test_local_masters_use_the_raw_local_file_system_and_file_system_checkpoint_logs() -> None:
    for master in ("local[2]", "local", " LOCAL-cluster[2,1,1024]"):
        assert session._local_files_conf(master) == {
            "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
            "spark.sql.streaming.checkpointFileManagerClass":
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
            "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer"}


def test_cluster_masters_keep_sparks_file_settings() -> None:
    for master in ("yarn", "spark://host:7077", "k8s://https://api:6443"):
        assert session._local_files_conf(master) == {}


def test_importing_the_kafka_source_leaves_the_engine_unimported() -> None:
    """Spark's Python workers import the Kafka source; the public names of the package are
    imported on first use, so a worker does not pay for the MERGE engine and delta-rs."""
    probe = ("import sys, streaming_merge.kafka.source; "
             "print(sorted(m for m in ('streaming_merge.merge.command', 'streaming_merge.streaming.sink', 'deltalake') "
             "if m in sys.modules)); "
             "from streaming_merge import DeltaTable, MergeSink, errors; import streaming_merge; "
             "print(DeltaTable.__module__, MergeSink.__module__, errors.__name__, "
             "streaming_merge.MergeOptions.__name__)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "[]", "streaming_merge.delta_table streaming_merge.streaming.sink streaming_merge.errors MergeOptions"]
    with pytest.raises(AttributeError, match="module 'streaming_merge' has no attribute 'Nope'"):
        streaming_merge.Nope  # noqa: B018


def test_a_short_local_run_stops_the_drivers_jit_at_c1_and_keeps_given_java_options() -> None:
    assert session._short_run_conf("local[2]", {}) == {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    given = {"spark.driver.extraJavaOptions": "-Dfoo=1"}
    assert session._short_run_conf("local[*]", given) == {
        "spark.driver.extraJavaOptions": "-Dfoo=1 -XX:TieredStopAtLevel=1"}
    # The caller's own JIT level wins; cluster masters keep their JVMs' defaults.
    assert session._short_run_conf("local", {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}) == {}
    assert session._short_run_conf("yarn", {}) == {}


def test_a_local_driver_logs_with_the_packages_quiet_settings_unless_the_caller_set_up_logging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    options = session._quiet_start_conf("local[2]", {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
    given, setting = options["spark.driver.extraJavaOptions"].split(" ")
    assert given == "-XX:TieredStopAtLevel=1"
    name, uri = setting.split("=", 1)
    assert name == "-Dlog4j2.configurationFile"
    settings = Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path)).read_text()
    assert "rootLogger.level = warn" in settings
    assert "logger.native_hadoop.name = org.apache.hadoop.util.NativeCodeLoader" in settings
    # The caller's own logging set-up and cluster masters are left alone.
    assert session._quiet_start_conf("local", {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=x"}) == {}
    assert session._quiet_start_conf("yarn", {}) == {}
    monkeypatch.setenv("SPARK_CONF_DIR", "/etc/spark/conf")
    assert session._quiet_start_conf("local[2]", {}) == {}


@pytest.mark.spark
@pytest.mark.slow
def test_a_local_session_starts_without_sparks_start_up_notices() -> None:
    """A new process, as a user's first run: stderr holds none of Spark's and Hadoop's
    start-up notices (the JVM's own incubator-module line is out of Spark's reach)."""
    probe = ("from streaming_merge.session import local_session; "
             "print(local_session('quiet', 'local[1]').range(3).count())")
    env = {key: value for key, value in os.environ.items() if key != "SPARK_CONF_DIR"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env,
                            timeout=300)
    assert result.stdout.strip() == "3"
    for notice in ("Using Spark's default log4j profile", "Setting default log level",
                   "To adjust logging level", "NativeCodeLoader"):
        assert notice not in result.stderr, result.stderr


def test_late_c2_raises_the_optimizing_compilers_thresholds_unless_the_caller_chose_a_jit() -> None:
    late = session._late_c2_conf("local[2]", {"spark.driver.extraJavaOptions": "-Dfoo=1"})
    options = late["spark.driver.extraJavaOptions"].split(" ")
    assert options[0] == "-Dfoo=1"
    assert "-XX:Tier4InvocationThreshold=50000" in options and "-XX:Tier4BackEdgeThreshold=400000" in options
    for own in ("-XX:TieredStopAtLevel=1", "-XX:-TieredCompilation", "-XX:Tier4InvocationThreshold=100",
                "-XX:CompileThresholdScaling=0.5"):
        assert session._late_c2_conf("local", {"spark.driver.extraJavaOptions": own}) == {}, own
    assert session._late_c2_conf("yarn", {}) == {}
    # A short run stops at C1: no C2 thresholds then.
    conf, build = session._session_conf("local[2]", {}, short_run=True, late_c2=True, class_archive=False)
    assert build is None
    assert "TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"]
    assert "Tier4" not in conf["spark.driver.extraJavaOptions"]
    conf, _ = session._session_conf("local[2]", {}, late_c2=True, class_archive=False)
    assert "Tier4InvocationThreshold" in conf["spark.driver.extraJavaOptions"]


def test_settings_of_spark_defaults_conf_and_pyspark_submit_args_are_explicit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "spark-defaults.conf").write_text("# a comment\n\nspark.sql.shuffle.partitions   7\n"
                                                  "spark.ui.enabled=true\nspark.executor.memory\t3g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 5g --conf spark.sql.session.timeZone=Europe/Paris "
                       "--conf 'spark.driver.extraJavaOptions=-Da=1 -Db=2' pyspark-shell")
    assert given_conf.defaults_file_settings() == {
        "spark.sql.shuffle.partitions": "7", "spark.ui.enabled": "true", "spark.executor.memory": "3g"}
    given = given_conf.given_settings({"spark.executor.memory": "4g"})
    assert given == {"spark.sql.shuffle.partitions": "7", "spark.ui.enabled": "true", "spark.executor.memory": "4g",
                     "spark.driver.memory": "5g", "spark.sql.session.timeZone": "Europe/Paris",
                     "spark.driver.extraJavaOptions": "-Da=1 -Db=2"}


def test_each_local_default_can_be_left_at_sparks_value() -> None:
    every = session._local_defaults(ui=False, shuffle_partitions=4, keep=frozenset())
    assert every["spark.ui.enabled"] == "false" and every["spark.sql.shuffle.partitions"] == "4"
    kept = session._local_defaults(ui=False, shuffle_partitions=4, keep=frozenset({"ui", "partitions"}))
    assert not {"spark.ui.enabled", "spark.sql.shuffle.partitions", "spark.default.parallelism"} & set(kept)
    assert "spark.ui.enabled" not in session._local_defaults(ui=True, shuffle_partitions=4, keep=frozenset())
    with pytest.raises(InvalidArgumentError, match="unknown local default 'uii'; the local defaults are ui, "
                                                   "partitions, quiet-log"):
        session._checked_default_names(["uii"])


@pytest.mark.spark
@pytest.mark.slow
def test_a_local_job_session_keeps_the_settings_of_spark_defaults_conf(tmp_path: Path) -> None:
    """A job's own local session, as a user's run with a ``spark-defaults.conf`` of theirs:
    its settings survive our defaults; a kept default is Spark's; the caller's settings win."""
    (tmp_path / "spark-defaults.conf").write_text("spark.sql.shuffle.partitions 7\n"
                                                  "spark.sql.session.timeZone Europe/Paris\n"
                                                  "spark.hadoop.fs.s3a.fast.upload.buffer disk\n")
    probe = ("from streaming_merge.session import job_session; "
             "s = job_session('defaults', 'local[1]', keep_spark_defaults=['ui'], "
             "extra_conf={'spark.sql.adaptive.enabled': 'false'}); "
             "print(*(s.conf.get(k) for k in ('spark.sql.shuffle.partitions', 'spark.sql.session.timeZone', "
             "'spark.sql.adaptive.enabled', 'spark.sql.execution.arrow.localRelationThreshold')), "
             "s.sparkContext.uiWebUrl is not None, s._jsc.hadoopConfiguration().get('fs.s3a.fast.upload.buffer'))")
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env,
                            timeout=300)
    assert result.stdout.splitlines() == ["7 Europe/Paris false 1048576 True disk"], result.stderr
    assert "[cds]" not in result.stderr, "no class archive with a configuration folder on the class path"

