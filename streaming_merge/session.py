"""A SparkSession with sane local defaults for jobs, demos, tests and benchmarks.

The library works with any SparkSession; this is only a convenience so that a laptop
run is quiet and fast (few shuffle partitions, no UI unless asked).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Collection, Mapping
from importlib import resources
from pathlib import Path

from pyspark.sql import SparkSession

from streaming_merge.errors import InvalidArgumentError
from streaming_merge.spark import class_archive as _class_archive
from streaming_merge.spark.answers_at_once import answer_at_once
from streaming_merge.spark.given_conf import conf_folder, defaults_file_settings, given_settings
from streaming_merge.spark.packages import package_conf

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
C1_ONLY = "-XX:TieredStopAtLevel=1"
# HotSpot's C2 thresholds (defaults 5000, 600, 15000, 40000) times ten: see _late_c2_conf.
LATE_C2 = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
           "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000")
_JIT_OPTIONS = ("TieredStopAtLevel", "TieredCompilation", "Tier4", "CompileThreshold", "CompilationMode")
QUIET_LOGGING_FILE = "log4j2-quiet.properties"
# Arrow or pandas data given to createDataFrame past this stays Arrow batches (see local_session).
LOCAL_RELATION_MAX_BYTES = 1 << 20
LOG4J2_CONFIGURATION = "log4j2.configurationFile"
_ADDRESS_SETTINGS = ("spark.driver.host", "spark.driver.bindAddress")
LOCAL_FILE_SYSTEM_SETTING = "spark.hadoop.fs.file.impl"
S3A_UPLOAD_BUFFER_SETTING = "spark.hadoop.fs.s3a.fast.upload.buffer"
RAW_LOCAL_FILE_SYSTEM = "org.apache.hadoop.fs.RawLocalFileSystem"
CHECKPOINT_MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINT_MANAGER = \
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


# The local defaults a caller can keep Spark's own value of, by name (``keep_spark_defaults``;
# the jobs' ``--keep-spark-default``): the UI, the shuffle partitions, the quiet log.
UI_DEFAULT, PARTITIONS_DEFAULT, QUIET_LOG_DEFAULT = "ui", "partitions", "quiet-log"
LOCAL_DEFAULT_NAMES = (UI_DEFAULT, PARTITIONS_DEFAULT, QUIET_LOG_DEFAULT)
_PYTHON_SETTING = "spark.pyspark.python"


def job_session(
    app_name: str,
    master: str = "local[2]",
    *,
    extra_conf: Mapping[str, str] | None = None,
    packages: tuple[str, ...] = (),
    keep_spark_defaults: Collection[str] = (),
    short_run: bool = False,
    late_c2: bool = False,
) -> SparkSession:
    """The session a job runs in: the platform's where a driver JVM already runs (under
    ``spark-submit``, a notebook, Spark Connect), unchanged; else one this call creates, with
    :func:`local_session`'s defaults for a local master and nothing but the caller's settings
    for a cluster master (``yarn``, ``k8s://``, ``spark://``).

    ``extra_conf`` holds settings the user gave the job (its ``--spark-conf``). ``packages``
    (see :func:`streaming_merge.spark.packages.package_conf`) are added to a session this call
    creates; under spark-submit they are spark-submit's ``--packages``."""
    given = dict(extra_conf or {})
    if not starts_jvm():
        return _platform_session(given)
    conf = {**package_conf(packages), **given}
    if not _is_local(master):
        builder = SparkSession.builder.appName(app_name).master(master)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        answer_at_once(spark)
        return spark
    return local_session(app_name, master, extra_conf=conf, keep_spark_defaults=keep_spark_defaults,
                         short_run=short_run, late_c2=late_c2)


def _platform_session(given: Mapping[str, str]) -> SparkSession:
    """The session of the driver JVM already running, with the user's own settings (``given``):
    all of them when the SparkContext is yet to start (spark-submit's driver), else those a
    running session can take; a static setting then is an error that says where it goes."""
    from pyspark.core.context import SparkContext

    if SparkContext._active_spark_context is None:
        builder = SparkSession.builder
        for key, value in given.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    else:
        spark = SparkSession.builder.getOrCreate()
        static = sorted(key for key in given if not spark.conf.isModifiable(key))
        if static:
            raise InvalidArgumentError(
                f"{', '.join(static)}: static Spark settings cannot change in the running session the platform "
                "gave; set them where it starts (spark-submit --conf KEY=VALUE, the cluster's spark-defaults.conf)")
        for key, value in given.items():
            spark.conf.set(key, value)
    answer_at_once(spark)
    return spark


def local_session(
    app_name: str = "streaming_merge",
    master: str = "local[2]",
    *,
    ui: bool = False,
    shuffle_partitions: int = 4,
    extra_conf: Mapping[str, str] | None = None,
    keep_spark_defaults: Collection[str] = (),
    short_run: bool = False,
    class_archive: bool | None = None,
    late_c2: bool = False,
) -> SparkSession:
    """Get or create a local SparkSession configured for small-to-medium data.

    Its defaults (:func:`_local_defaults`: no UI unless ``ui``, ``shuffle_partitions``, a quiet
    log, the settings each function below explains) never replace a setting the user made:
    ``extra_conf``, ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS``
    (:mod:`streaming_merge.spark.given_conf`). ``keep_spark_defaults`` names defaults of
    ``LOCAL_DEFAULT_NAMES`` to leave at Spark's own value.

    Python workers (the Kafka source's readers) run this interpreter, so they import the
    same streaming_merge as the driver. ``short_run``: the process ends within a minute or
    so (a demo); see :func:`_short_run_conf`. It only applies when this call starts the JVM.
    ``class_archive``: map a class-data-sharing archive of the driver's classes into a local
    driver JVM this call starts, built by the first such session (see
    :mod:`streaming_merge.spark.class_archive`); None follows ``STREAMING_MERGE_CLASS_ARCHIVE``
    (default on, ``0`` turns it off). ``late_c2``: the driver JVM's optimizing compiler only
    takes methods that stay hot (:func:`_late_c2_conf`), for a long-running job that restarts.
    """
    keep = _checked_default_names(keep_spark_defaults)
    code_conf = dict(extra_conf or {})
    given = given_settings(code_conf)
    if _PYTHON_SETTING not in given:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    quiet_log = QUIET_LOG_DEFAULT not in keep
    conf, archive_build = _session_conf(master, code_conf, short_run=short_run, class_archive=class_archive,
                                        starts_jvm=starts_jvm(), late_c2=late_c2, quiet_log=quiet_log)
    defaults = {**_local_defaults(ui=ui, shuffle_partitions=shuffle_partitions, keep=keep), **conf}
    # The caller's own settings are in ``conf``; the file's and PYSPARK_SUBMIT_ARGS' beat ours
    # (the driver's Java options of the file are in ``conf`` already, ours appended to them).
    settings = {k: v for k, v in defaults.items() if k in code_conf or k == DRIVER_JAVA_OPTIONS or k not in given}
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except BaseException:
        if archive_build is not None:
            archive_build.abandon()
        raise
    if archive_build is not None:
        archive_build.started(spark)
    if quiet_log and not _logging_given(given):
        spark.sparkContext.setLogLevel("ERROR")
    answer_at_once(spark)
    return spark


def _local_defaults(*, ui: bool, shuffle_partitions: int, keep: frozenset[str]) -> dict[str, str]:
    """The settings a local session gets unless the user made them or ``keep`` names them."""
    defaults = {
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "true",
        # PySpark 4 otherwise records the Python call site of every Column function in the
        # JVM (about five py4j round trips per call) for error messages: hundreds of round
        # trips per MERGE, a third of a small MERGE's driver time.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # createDataFrame of Arrow or pandas data past 1 MB keeps it as Arrow batches read by
        # tasks, not as rows inside the plan (Spark's bound is 48 MB): every query over a plan
        # holding 100k rows spent ~110 ms planning it here, and its first read ~200 ms more.
        "spark.sql.execution.arrow.localRelationThreshold": str(LOCAL_RELATION_MAX_BYTES),
    }
    if UI_DEFAULT not in keep and not ui:
        defaults.update({"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    if PARTITIONS_DEFAULT not in keep:
        defaults.update({"spark.sql.shuffle.partitions": str(shuffle_partitions),
                         "spark.default.parallelism": str(shuffle_partitions)})
    if hasattr(socket, "AF_UNIX"):
        # A JVM and its Python workers talk over a Unix domain socket instead of TCP loopback:
        # each Python task (the Kafka source's reads, mapInArrow) then costs ~20 ms, not ~65
        # (a trivial Python streaming source here: 21 vs 65 ms a task, 49 vs 100 ms a batch).
        defaults["spark.python.unix.domain.socket.enabled"] = "true"
    return defaults


def _checked_default_names(names: Collection[str]) -> frozenset[str]:
    unknown = sorted(set(names) - set(LOCAL_DEFAULT_NAMES))
    if unknown:
        raise InvalidArgumentError(f"keep_spark_defaults: unknown local default {', '.join(map(repr, unknown))}; "
                                   f"the local defaults are {', '.join(LOCAL_DEFAULT_NAMES)}")
    return frozenset(names)


def _logging_given(given: Mapping[str, str]) -> bool:
    """Whether the user set up Spark's logging: a log4j2 file of their own, in the driver's
    options or ``SPARK_CONF_DIR``."""
    return LOG4J2_CONFIGURATION in given.get(DRIVER_JAVA_OPTIONS, "") or (conf_folder() / "log4j2.properties").exists()


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()`` without PySpark's wait on its accumulator server.

    Once a Python worker has run, the JVM holds a connection to the driver's accumulator server,
    whose handler polls for a shutdown flag once a second in the server's only thread; stopping
    the server waits for that poll, most of a job's exit (bench/private_apis.md). After the
    SparkContext has stopped no update can come, so the flag is set, the server closed, and its
    daemon thread left to end with the process. The server is PySpark's private state;
    tests/unit/test_private_apis_no_jvm.py fails when a PySpark upgrade renames it."""
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True
        context._accumulatorServer = None  # type: ignore[assignment]  # SparkContext.stop would wait on it
    try:
        spark.stop()
    finally:
        if server is not None:
            server.server_close()


def _session_conf(master: str, extra_conf: Mapping[str, str], *, short_run: bool = False,
                  class_archive: bool | None = None, starts_jvm: bool = True, late_c2: bool = False,
                  quiet_log: bool = True) -> tuple[dict[str, str], _class_archive.Build | None]:
    """The settings :func:`local_session` passes besides its fixed ones, and the class archive
    this process builds, if it does. The driver JVM's options are the caller's (``extra_conf``,
    else ``spark-defaults.conf``'s) followed by this module's; options only matter to a JVM that
    is not running yet (``starts_jvm``)."""
    conf = {**_loopback_conf(master, extra_conf), **_local_files_conf(master), **extra_conf}
    if starts_jvm:
        conf.update(_defaults_file_java_options_for(master, conf))
    given_java_options = conf.get(DRIVER_JAVA_OPTIONS, "")
    if short_run:
        conf.update(_short_run_conf(master, conf))
    elif late_c2:
        conf.update(_late_c2_conf(master, conf))
    if quiet_log:
        conf.update(_quiet_start_conf(master, conf))
    build: _class_archive.Build | None = None
    if starts_jvm and _is_local(master) and _class_archive.wanted(class_archive, given_java_options):
        option, build = _class_archive.prepare(conf, given_java_options)
        if option:
            conf.update(_with_driver_java_option(conf, option))
    return conf, build


def class_archive_path(master: str = "local[2]", extra_conf: Mapping[str, str] | None = None,
                       class_archive: bool | None = None) -> Path | None:
    """The class archive that ``local_session(..., master, extra_conf=..., class_archive=...)``
    started now would map, or build when it is missing; None when it would use none (a cluster
    master, archives off, no JDK found). :func:`streaming_merge.spark.class_archive.complete`
    says whether it is built.

    For a step that builds the archive before the JVMs that should map it start: a container
    image's build, or a test session whose driver subprocesses would otherwise all start while
    the first local JVM, the archive's builder, still runs, and so without it."""
    if not _is_local(master):
        return None
    conf = dict(extra_conf or {})
    conf.update(_defaults_file_java_options_for(master, conf))
    given_java_options = conf.get(DRIVER_JAVA_OPTIONS, "")
    if not _class_archive.wanted(class_archive, given_java_options):
        return None
    return _class_archive.path_for(conf, given_java_options)


def starts_jvm() -> bool:
    """Whether creating a session now starts a driver JVM in this process (not under
    spark-submit, not Spark Connect, not once a JVM runs)."""
    from pyspark.core.context import SparkContext

    return (SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
            and not os.environ.get("SPARK_REMOTE") and not os.environ.get("SPARK_CONNECT_MODE_ENABLED"))


def _defaults_file_java_options_for(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The driver JVM options a local session takes from ``spark-defaults.conf``: none when the
    caller gave their own (``conf``) or the master is not local."""
    if not _is_local(master) or DRIVER_JAVA_OPTIONS in conf:
        return {}
    return _defaults_file_java_options()


def _defaults_file_java_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``spark.driver.extraJavaOptions`` from ``spark-defaults.conf``: a ``--conf`` of the same
    setting replaces the file's value, so options this module adds are appended to it instead."""
    options = defaults_file_settings(environ).get(DRIVER_JAVA_OPTIONS)
    return {DRIVER_JAVA_OPTIONS: options} if options else {}


def _is_local(master: str) -> bool:
    return master.strip().lower().startswith("local")


def _local_files_conf(master: str) -> dict[str, str]:
    """Local files without the forks a JVM makes when Hadoop's native library is missing (the
    pyspark wheel has none): Hadoop's local file system then sets every new file's and
    folder's permissions by running ``chmod`` and reads link status by running ``readlink``,
    one child process of the (large) driver JVM each.

    - ``file:`` is Hadoop's raw local file system, without the checksum layer. The checksum
      layer writes a ``.crc`` file beside each file (a second create, a second ``chmod``) and
      checks both on every rename: creating a file took 28 ms through it and 6 ms without
      it here, a folder 26 and 10 ms. Parquet has its own checksums (page CRCs, footers) and
      Delta's log is written by delta-rs; nothing reads the ``.crc`` files.
    - Streaming checkpoint logs go through Hadoop's FileSystem API. Spark's default goes
      through FileContext, whose rename asks for the link status of both paths (``readlink``
      several times per entry): the offset and commit logs took 44 and 48 ms per micro-batch,
      12 and 12 through FileSystem's rename. Both write a temporary file and rename it; the
      FileSystem manager checks that the entry does not exist before renaming instead of
      asking the rename to refuse, which differs only for two writers of one checkpoint, and
      Spark already stops a second run of a query on the same checkpoint.

    S3A buffers the blocks it uploads in local files through Hadoop's checksummed
    ``LocalFileSystem`` and refuses the raw one (``ClassCastException``), so its uploads are
    buffered in memory instead (``fs.s3a.fast.upload.buffer=bytebuffer``: off-heap blocks of
    ``fs.s3a.multipart.size``, at most ``fs.s3a.fast.upload.active.blocks`` a stream).

    Cluster masters keep Spark's defaults: their data and checkpoints live on HDFS or object
    stores, and their executors may have the native library."""
    if not _is_local(master):
        return {}
    return {LOCAL_FILE_SYSTEM_SETTING: RAW_LOCAL_FILE_SYSTEM,
            CHECKPOINT_MANAGER_SETTING: FILE_SYSTEM_CHECKPOINT_MANAGER,
            S3A_UPLOAD_BUFFER_SETTING: "bytebuffer"}


def _short_run_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """The driver JVM's JIT stops at C1 (``-XX:TieredStopAtLevel=1``) for a local run that
    ends within a minute or so: in local mode the driver is also the executor.

    Spark's planning code (Catalyst's rules, the analyzer, the optimizer) is hot enough for
    the optimizing C2 compiler on every new query for tens of micro-batches; on 2 cores
    C2's compiler thread takes CPU the run needs and its code pays back only later. Measured
    on the 2-core machine (``jobs.kafka_cdc_demo``, alternating runs): the JIT's threads
    used 14-17 s of the JVM's 31-38 s of CPU, 3 s of 19.5-21.5 s with C1 alone, and the
    demo caught up in 13.7-15.1 s instead of 19.9-20.6 s. Longer runs lose with it: the
    test suite's heaviest files took 355 s instead of 292 s and a warm 1M x 100k MERGE
    5.4-5.9 s instead of 3.4-3.8 s, so it is for short runs only; cluster masters keep
    their JVMs' defaults. Options the caller gave for the driver's JVM are kept."""
    if not _is_local(master):
        return {}
    if "TieredStopAtLevel" in conf.get(DRIVER_JAVA_OPTIONS, ""):
        return {}
    return _with_driver_java_option(conf, C1_ONLY)


def _late_c2_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """The driver JVM's C2 (optimizing) compiler takes a method after ten times HotSpot's default
    invocation and loop counts (``LATE_C2``); C1 compiles as usual.

    A JVM's start is mostly code that runs a few thousand times and never again: Spark's and
    Scala's start-up, class loading, the first query's planning. With the default thresholds C2
    compiles much of it, and on 2 cores its compiler thread takes the CPU the start needs: in
    a restart of the Kafka job to its first MERGE the C2 thread used 6.0 s of the driver JVM's
    14.7 s of CPU (bench/startup.py, JVM thread groups). Code that stays hot (a stream's
    per-batch planning, tasks' row loops) passes the higher thresholds within its first batches
    and is compiled by C2 then, unlike ``-XX:TieredStopAtLevel=1`` (short runs), which
    never compiles with C2. The caller's own JIT options win; cluster masters keep their JVMs'
    defaults."""
    if not _is_local(master) or any(option in conf.get(DRIVER_JAVA_OPTIONS, "") for option in _JIT_OPTIONS):
        return {}
    return _with_driver_java_option(conf, LATE_C2)


def _quiet_start_conf(master: str, conf: dict[str, str]) -> dict[str, str]:
    """A local driver JVM logs with the package's log4j2 settings (WARN, as Spark's Python
    shells use, and Hadoop's "Unable to load native-hadoop library" at ERROR: the pyspark
    wheel has no native library and Hadoop's Java code is used instead, nothing to act on).

    With Spark's built-in defaults every start prints four lines before the first line of the
    job ("Using Spark's default log4j profile", "Setting default log level", "To adjust
    logging level", the native-library warning); a new user's first run should show only the
    job's output. Kept out of the way of any logging set-up of the caller's: their own
    ``log4j2.configurationFile`` option, or a ``SPARK_CONF_DIR`` (which may hold a
    ``log4j2.properties``). Cluster masters keep their own."""
    if not _is_local(master) or LOG4J2_CONFIGURATION in conf.get(DRIVER_JAVA_OPTIONS, "") or \
            os.environ.get("SPARK_CONF_DIR"):
        return {}
    settings = resources.files("streaming_merge").joinpath(QUIET_LOGGING_FILE)
    uri = Path(str(settings)).resolve().as_uri()  # percent-encoded: no space splits the options
    return _with_driver_java_option(conf, f"-D{LOG4J2_CONFIGURATION}={uri}")


def _with_driver_java_option(conf: dict[str, str], option: str) -> dict[str, str]:
    """The driver JVM's options with ``option`` after those already given."""
    return {DRIVER_JAVA_OPTIONS: f"{conf.get(DRIVER_JAVA_OPTIONS, '').strip()} {option}".strip()}


def _loopback_conf(master: str, extra_conf: Mapping[str, str]) -> dict[str, str]:
    """Bind a local master to loopback unless the user chose an address.

    Without an address Spark looks up the machine's hostname; where that resolves to a
    loopback address (most laptops and containers) it warns on every start ("Your hostname
    ... resolves to a loopback address ... Set SPARK_LOCAL_IP") and binds to the first
    non-loopback interface instead, which a local run never needs. SPARK_LOCAL_IP must be in
    the environment before the JVM starts: the warning comes from the launcher, before any
    Spark setting is read."""
    if not _is_local(master):
        return {}
    if any(os.environ.get(name) for name in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")) or \
            any(key in extra_conf for key in _ADDRESS_SETTINGS):
        return {}
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    log.debug("Local master %s: driver bound to %s", master, LOOPBACK)
    return {"spark.driver.host": LOOPBACK}
