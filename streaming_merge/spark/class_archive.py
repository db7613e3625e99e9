"""A class-data-sharing archive of the local driver JVM's classes (JDK AppCDS), for faster starts.

A local SparkSession spends most of its start loading, parsing and verifying Spark's classes
from 280 jars, and its first query as much again for Catalyst's. HotSpot can dump the classes a
JVM loaded into an archive at exit (``-XX:ArchiveClassesAtExit``, JDK 13+) and map that archive
into later JVMs (``-XX:SharedArchiveFile``), which then skip the loading and verification of
those classes. Measured on the 2-core machine (bench/startup.py): session creation 8.2-9.2 s →
5.6-5.7 s, the first trivial job 4.6-4.9 s → 2.3-2.6 s.

How it is used, by :func:`streaming_merge.session.local_session` only (never a session the user
builds):

- One archive per *key*: the JVM (its real path, its ``release`` file, libjvm and the JDK's own
  base archive, which a dynamic archive is layered on), pyspark's version and jars (names,
  sizes, modification times), the environment variables and Spark settings that change the
  driver's class path or JVM flags, and the caller's own driver JVM options. A JDK or pyspark
  upgrade, another jar, another heap size: another key, so a stale archive is never mapped (the
  JVM checks the class path and jar times itself too, and on a mismatch warns and starts
  without it: ``-Xshare:auto``, the default).
- Archives live in ``$STREAMING_MERGE_CACHE_DIR`` or ``$XDG_CACHE_HOME/streaming_merge`` or
  ``~/.cache/streaming_merge`` (``class-archives/``), ~155 MB each. Archives of other keys not
  used for 30 days are deleted when a new one is built.
- Built on first use: the first local session of a key whose archive is missing runs its JVM
  with ``-XX:ArchiveClassesAtExit=<archive>.<pid>.tmp`` (its own work is what gets archived). At
  interpreter exit the session's JVM is asked to exit (its stdin closed, as when Python exits)
  and waited for while it writes the archive (several seconds, once); the file is then checked
  by mapping it in a throw-away JVM with ``-Xshare:on`` (a truncated archive would crash a JVM
  with SIGBUS instead of being refused) and renamed into place atomically. Only one process
  builds a key at a time (an exclusive ``flock``, released by the kernel if the process dies);
  the others start without an archive. A process killed before that leaves a temporary file,
  removed by the next build of the key.
- ``STREAMING_MERGE_CLASS_ARCHIVE=0`` (or ``local_session(class_archive=False)``) turns it off;
  options of the caller's that already choose class sharing (``-Xshare``,
  ``-XX:SharedArchiveFile``, ``-XX:ArchiveClassesAtExit``) turn it off too.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ARCHIVE_ENV = "STREAMING_MERGE_CLASS_ARCHIVE"
CACHE_DIR_ENV = "STREAMING_MERGE_CACHE_DIR"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The caller's own choice of class sharing: left alone.
SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "AutoCreateSharedArchive",
                   "DumpLoadedClassList", "SharedClassListFile")
# What changes the driver JVM's class path, flags or the classes it loads at start.
KEY_ENVIRONMENT = ("SPARK_HOME", "SPARK_CONF_DIR", "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH", "HADOOP_CONF_DIR",
                   "YARN_CONF_DIR", "SPARK_PREPEND_CLASSES", "SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS",
                   "PYSPARK_SUBMIT_ARGS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS",
                   "SPARK_SCALA_VERSION")
KEY_SETTINGS = ("spark.driver.extraClassPath", "spark.driver.memory", "spark.driver.defaultJavaOptions",
                "spark.jars", "spark.jars.packages", "spark.driver.userClassPathFirst")
_OFF = ("0", "false", "off", "no")
FREE_SPACE_NEEDED = 1 << 30  # a build is skipped below 1 GiB free (the archive is ~155 MB)
UNUSED_DAYS = 30
EXIT_TIMEOUT_S = 600.0
CHECK_TIMEOUT_S = 120.0
ARCHIVE_PREFIX = "spark-driver-"
ARCHIVE_SUFFIX = ".jsa"


def wanted(enabled: bool | None, given_options: str) -> bool:
    """The archive is on unless the caller, the environment or the caller's own JVM options say otherwise."""
    if enabled is None:
        enabled = os.environ.get(ARCHIVE_ENV, "1").strip().lower() not in _OFF
    return enabled and not any(option in given_options for option in SHARING_OPTIONS) and not _folders_on_class_path()


def _folders_on_class_path(environ: Mapping[str, str] | None = None) -> list[str]:
    """The configuration folders Spark's launcher puts on the driver's class path that hold
    files: HotSpot refuses to dump or map an archive whose class path has a non-empty folder."""
    env = os.environ if environ is None else environ
    folders = [env[name] for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR") if env.get(name)]
    return [folder for folder in folders if Path(folder).is_dir() and any(Path(folder).iterdir())]


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV]) / "class-archives"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "streaming_merge" / "class-archives"


def java_home(environ: Mapping[str, str] | None = None) -> Path | None:
    """The JDK spark-submit runs: ``$JAVA_HOME``, else ``java`` on the PATH (as bin/spark-class)."""
    env = os.environ if environ is None else environ
    if env.get("JAVA_HOME"):
        binary = Path(env["JAVA_HOME"]) / "bin" / "java"
    else:
        found = shutil.which("java", path=env.get("PATH"))
        if found is None:
            return None
        binary = Path(found)
    try:
        return binary.resolve(strict=True).parent.parent
    except OSError:
        return None


def spark_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).parent


def _stat(path: Path) -> list[Any]:
    try:
        info = path.stat()
    except OSError:
        return [str(path), None]
    return [str(path), info.st_size, info.st_mtime_ns]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def key_material(settings: Mapping[str, str], given_options: str,
                 environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Everything the archive's validity depends on, or None without a JVM to key by."""
    env = os.environ if environ is None else environ
    jdk = java_home(env)
    if jdk is None:
        return None
    import pyspark

    home = spark_home(env)
    jars = home / "jars"
    try:
        listing = [[entry.name, *_stat(entry)[1:]] for entry in sorted(jars.iterdir())]
    except OSError:
        listing = []
    return {
        "format": 1,
        "java": [str(jdk), _read(jdk / "release"), _stat(jdk / "lib" / "server" / "libjvm.so"),
                 _stat(jdk / "lib" / "server" / "classes.jsa")],
        "pyspark": [pyspark.__version__, str(home.resolve()), listing],
        "environment": {name: env.get(name) for name in KEY_ENVIRONMENT},
        "settings": {name: settings.get(name) for name in KEY_SETTINGS},
        "options": given_options.strip(),
    }


def archive_path(material: Mapping[str, Any], directory: Path) -> Path:
    """``spark-driver-<pyspark version>-java<feature version>-<hash>.jsa`` in ``directory``."""
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:20]
    release = material["java"][1] or ""
    version = next((line.split("=", 1)[1].strip().strip('"') for line in release.splitlines()
                    if line.startswith("JAVA_VERSION=")), "unknown")
    return directory / f"{ARCHIVE_PREFIX}{material['pyspark'][0]}-java{version}-{digest}{ARCHIVE_SUFFIX}"


@dataclass
class Build:
    """A driver JVM started with ``-XX:ArchiveClassesAtExit``: finished (waited for, checked,
    renamed into place) at interpreter exit."""

    archive: Path
    lock_fd: int
    temporary: Path = field(init=False)
    _process: Any = field(default=None, init=False, repr=False)
    _java: str | None = field(default=None, init=False)
    _class_path: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.temporary = self.archive.with_name(f"{self.archive.name}.{os.getpid()}.tmp")

    def option(self) -> str:
        # -Xlog: the dump lists every class it skips as a warning on stdout (hundreds of lines).
        return f"-XX:ArchiveClassesAtExit={self.temporary} -Xlog:cds*=error"

    def started(self, spark: Any) -> None:
        """The session is up: its JVM will write the archive when it exits."""
        from pyspark.core.context import SparkContext

        gateway = SparkContext._gateway
        process = getattr(gateway, "proc", None) if gateway is not None else None
        if process is None:  # not a JVM this process started
            self.abandon()
            return
        self._process = process
        system = spark._jvm.java.lang.System
        self._java = str(Path(str(system.getProperty("java.home"))) / "bin" / "java")
        self._class_path = str(system.getProperty("java.class.path"))
        atexit.register(self.finish)

    def finish(self) -> None:
        """Have the JVM exit (and write the archive), check the archive, move it into place."""
        process = self._process
        try:
            if process is None:
                return
            if process.poll() is None:
                log.info("Writing the driver's class archive %s (once)", self.archive)
                started = time.monotonic()
                with contextlib.suppress(OSError):
                    process.stdin.close()  # the JVM's gateway exits on EOF, as when Python exits
                try:
                    process.wait(timeout=EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.warning("The driver JVM did not exit within %.0f s; no class archive built", EXIT_TIMEOUT_S)
                    return
                log.info("Driver JVM exited after %.1f s", time.monotonic() - started)
            if process.returncode == 0 and self.temporary.exists() and self._usable(self.temporary):
                # The size first, then the archive: a reader that sees the archive sees its size.
                _size_file(self.archive).write_text(str(self.temporary.stat().st_size))
                os.replace(self.temporary, self.archive)
        except Exception:  # a faster start next time is not worth failing the exit over
            log.warning("Could not build the driver's class archive %s", self.archive, exc_info=True)
        finally:
            with contextlib.suppress(OSError):
                self.temporary.unlink()
            self.abandon()

    def _usable(self, candidate: Path) -> bool:
        """Whether a JVM maps ``candidate`` (-Xshare:on fails instead of starting without it)."""
        if self._java is None or self._class_path is None:
            return False
        try:
            # -XX:ErrorFile: a JVM that dies mapping a bad archive leaves no hs_err file in the working folder.
            result = subprocess.run([self._java, "-Xshare:on", f"-XX:SharedArchiveFile={candidate}",
                                     f"-XX:ErrorFile={os.devnull}", "-cp", self._class_path, "-version"],
                                    capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if result.returncode != 0:
            log.warning("The new class archive is unusable (exit %d): %s", result.returncode,
                        result.stderr.strip()[-500:])
        return result.returncode == 0

    def abandon(self) -> None:
        """Release the build lock (the JVM will not be waited for)."""
        if self.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = -1


def _size_file(archive: Path) -> Path:
    return archive.with_name(archive.name + ".size")


def complete(archive: Path) -> bool:
    """Whether ``archive`` is there with the size it was checked at. A JVM maps a truncated
    archive and dies of SIGBUS instead of refusing it, so a file of another size is never used."""
    try:
        return archive.stat().st_size == int(_size_file(archive).read_text().strip() or -1)
    except (OSError, ValueError):
        return False


def _lock(archive: Path) -> int | None:
    """An exclusive lock on building ``archive``, or None when another process holds it."""
    import fcntl

    fd = os.open(archive.with_name(archive.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _clean(directory: Path, archive: Path) -> None:
    """Left-over temporary files of this key (their builders are gone: the lock is ours), and
    archives of other keys unused for ``UNUSED_DAYS``."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    for entry in directory.iterdir():
        with contextlib.suppress(OSError):
            if entry.name.startswith(archive.name + ".") and entry.name.endswith(".tmp"):
                entry.unlink()
            elif entry.name.startswith(ARCHIVE_PREFIX) and entry.name.endswith(ARCHIVE_SUFFIX) and \
                    entry != archive and entry.stat().st_mtime < cutoff:
                entry.unlink()
                for extra in (".lock", ".size"):
                    with contextlib.suppress(OSError):
                        entry.with_name(entry.name + extra).unlink()


def path_for(settings: Mapping[str, str], given_options: str) -> Path | None:
    """The archive of this key in the cache folder (built or not), or None where there is none: no
    JVM to key by, or a platform other than Linux and macOS."""
    if sys.platform != "linux" and sys.platform != "darwin":
        return None
    material = key_material(settings, given_options)
    return None if material is None else archive_path(material, cache_dir())


def prepare(settings: Mapping[str, str], given_options: str) -> tuple[str | None, Build | None]:
    """The driver JVM option for this key (use the archive, or build it) and the build to
    finish, if this process builds it. (None, None): no archive this time."""
    archive = path_for(settings, given_options)
    if archive is None:
        return None, None
    directory = archive.parent
    if complete(archive):
        with contextlib.suppress(OSError):
            if time.time() - archive.stat().st_mtime > 86400:
                os.utime(archive)  # in use: kept by the clean-up of unused archives
        return f"-XX:SharedArchiveFile={archive}", None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(directory).free < FREE_SPACE_NEEDED:
            log.info("Less than 1 GiB free in %s: no driver class archive", directory)
            return None, None
        fd = _lock(archive)
        if fd is None:  # another process is building it
            return None, None
        if complete(archive):  # built while we were looking
            os.close(fd)
            return f"-XX:SharedArchiveFile={archive}", None
        with contextlib.suppress(FileNotFoundError):
            archive.unlink()  # of another size than it was checked at (or without its size): built again
        _clean(directory, archive)
    except OSError as exc:
        log.info("No driver class archive (%s)", exc)
        return None, None
    build = Build(archive, fd)
    return build.option(), build
