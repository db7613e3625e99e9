"""The driver class archive of ``local_session`` (streaming_merge.spark.class_archive): which archive a
session uses (its key), when it builds one, how it finishes a build, and how its option joins the
caller's driver JVM options. No SparkSession here; the few JVMs started are ``java -version``."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from streaming_merge import session
from streaming_merge.spark import class_archive as archive

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# javac --release 8 of ``public class Probe { public static void main(String[] a) {} }``: a class of
# the application class path, so that an archive records that path (and the jar's time and size).
PROBE_CLASS = ("yv66vgAAADQADAoAAgADBwAEDAAFAAYBABBqYXZhL2xhbmcvT2JqZWN0AQAGPGluaXQ+AQADKClWBwAIAQAFUHJvYmUB"
               "AARDb2RlAQAEbWFpbgEAFihbTGphdmEvbGFuZy9TdHJpbmc7KVYAIQAHAAIAAAAAAAIAAQAFAAYAAQAJAAAAEQABAAEAAAAFKrcA"
               "AbEAAAAAAAkACgALAAEACQAAAA0AAAABAAAAAbEAAAAAAAA=")


def fake_jdk(root: Path, version: str = "17.0.15") -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "java").write_text("#!/bin/sh\n")
    (root / "bin" / "java").chmod(0o755)
    (root / "lib" / "server").mkdir(parents=True)
    (root / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    (root / "lib" / "server" / "classes.jsa").write_bytes(b"base archive")
    (root / "release").write_text(f'JAVA_VERSION="{version}"\nIMPLEMENTOR="test"\n')
    return root


def fake_spark(root: Path) -> Path:
    (root / "jars").mkdir(parents=True)
    (root / "jars" / "spark-core.jar").write_bytes(b"core")
    (root / "jars" / "spark-sql.jar").write_bytes(b"sql")
    return root


@pytest.fixture()
def homes(tmp_path: Path) -> dict[str, str]:
    """An environment naming a fake JDK and a fake Spark home (nothing is run from them)."""
    return {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")), "SPARK_HOME": str(fake_spark(tmp_path / "spark")),
            "PATH": os.environ.get("PATH", "")}


def path_for(env: dict[str, str], settings: dict[str, str] | None = None, options: str = "",
             directory: Path = Path("/cache")) -> Path:
    material = archive.key_material(settings or {}, options, env)
    assert material is not None
    return archive.archive_path(material, directory)


def test_the_archive_is_keyed_by_the_jvm_pyspark_jars_class_path_settings_and_options(
        homes: dict[str, str], tmp_path: Path) -> None:
    import pyspark

    first = path_for(homes)
    assert first == path_for(homes), "the same inputs choose the same archive"
    assert first.parent == Path("/cache")
    assert first.name.startswith(f"spark-driver-{pyspark.__version__}-java17.0.15-") and first.suffix == ".jsa"

    changed: list[Path] = []
    jar = Path(homes["SPARK_HOME"]) / "jars" / "spark-core.jar"
    jar.write_bytes(b"core, rebuilt")  # another jar of the same name: its size (and time) changed
    changed.append(path_for(homes))
    (Path(homes["SPARK_HOME"]) / "jars" / "extra.jar").write_bytes(b"x")  # one jar more
    changed.append(path_for(homes))
    (Path(homes["JAVA_HOME"]) / "release").write_text('JAVA_VERSION="17.0.16"\n')  # a JDK update
    changed.append(path_for(homes))
    (Path(homes["JAVA_HOME"]) / "lib" / "server" / "classes.jsa").write_bytes(b"another base archive")
    changed.append(path_for(homes))
    changed.append(path_for({**homes, "SPARK_DIST_CLASSPATH": "/opt/hadoop/*"}))
    changed.append(path_for({**homes, "JAVA_TOOL_OPTIONS": "-XX:+UseSerialGC"}))
    changed.append(path_for(homes, {"spark.driver.extraClassPath": "/opt/extra.jar"}))
    changed.append(path_for(homes, {"spark.driver.memory": "40g"}))  # no compressed oops past 32 GB
    changed.append(path_for(homes, options="-XX:+UseParallelGC"))
    other_jdk = {**homes, "JAVA_HOME": str(fake_jdk(tmp_path / "jdk21", "21.0.2"))}
    changed.append(path_for(other_jdk))
    assert changed[-1].name.startswith(f"spark-driver-{pyspark.__version__}-java21.0.2-")
    assert len({first, *changed}) == len(changed) + 1, "every change chooses another archive"
    # Settings that do not touch the driver's JVM or class path keep the archive.
    last = path_for(homes)
    assert path_for(homes, {"spark.sql.shuffle.partitions": "8", "spark.app.name": "x"}) == last


def test_no_jvm_no_key(tmp_path: Path) -> None:
    assert archive.key_material({}, "", {"PATH": str(tmp_path), "SPARK_HOME": str(fake_spark(tmp_path / "s"))}) is None


def test_cache_folder_from_the_environment(tmp_path: Path) -> None:
    assert archive.cache_dir({"STREAMING_MERGE_CACHE_DIR": "/c"}) == Path("/c/class-archives")
    assert archive.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/streaming_merge/class-archives")
    assert archive.cache_dir({}) == Path.home() / ".cache" / "streaming_merge" / "class-archives"


def test_the_archive_is_on_by_default_and_off_by_parameter_environment_or_the_callers_own_sharing_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMING_MERGE_CLASS_ARCHIVE", raising=False)
    assert archive.wanted(None, "")
    assert archive.wanted(True, "-Dfoo=1 -XX:+UseG1GC")
    assert not archive.wanted(False, "")
    for option in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:ArchiveClassesAtExit=/x.jsa",
                   "-XX:+AutoCreateSharedArchive"):
        assert not archive.wanted(None, f"-Dfoo=1 {option}"), option
    for value in ("0", "false", "OFF", "no"):
        monkeypatch.setenv("STREAMING_MERGE_CLASS_ARCHIVE", value)
        assert not archive.wanted(None, "")
        assert archive.wanted(True, ""), "the parameter wins over the environment"
    monkeypatch.setenv("STREAMING_MERGE_CLASS_ARCHIVE", "1")
    assert archive.wanted(None, "")


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, homes: dict[str, str]) -> Path:
    for name, value in homes.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STREAMING_MERGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "class-archives"


def test_a_missing_archive_is_built_by_one_process_at_a_time_and_a_complete_one_is_used(cache: Path) -> None:
    option, build = archive.prepare({}, "")
    assert build is not None and option is not None
    target = build.archive
    assert target.parent == cache
    assert option == f"-XX:ArchiveClassesAtExit={target}.{os.getpid()}.tmp -Xlog:cds*=error"
    # While the build lock is held (another process's flock), nobody else builds nor uses it.
    assert archive.prepare({}, "") == (None, None)
    build.abandon()
    again, second = archive.prepare({}, "")
    assert second is not None and again == option
    second.abandon()

    # A complete archive (its size as recorded when it was checked) is used, by everyone at once.
    target.write_bytes(b"x" * 100)
    (cache / (target.name + ".size")).write_text("100")
    assert archive.prepare({}, "") == (f"-XX:SharedArchiveFile={target}", None)
    assert archive.prepare({}, "") == (f"-XX:SharedArchiveFile={target}", None)
    # Truncated (a JVM would die of SIGBUS mapping it) or without its size: never used, built again.
    target.write_bytes(b"x" * 60)
    option, build = archive.prepare({}, "")
    assert build is not None and option.startswith("-XX:ArchiveClassesAtExit=")
    assert not target.exists()
    build.abandon()


def test_a_build_cleans_left_over_temporary_files_and_long_unused_archives(cache: Path) -> None:
    _, build = archive.prepare({}, "")
    assert build is not None
    build.abandon()
    cache.mkdir(parents=True, exist_ok=True)
    left_over = cache / f"{build.archive.name}.12345.tmp"
    left_over.write_bytes(b"partial")
    old = cache / "spark-driver-3.5.0-java11-0123456789abcdef0123.jsa"
    recent = cache / "spark-driver-3.5.1-java11-0123456789abcdef0124.jsa"
    for path in (old, recent, old.with_name(old.name + ".size"), old.with_name(old.name + ".lock")):
        path.write_bytes(b"x")
    month_ago = os.path.getmtime(recent) - 31 * 86400
    os.utime(old, (month_ago, month_ago))
    _, build = archive.prepare({}, "")
    assert build is not None
    build.abandon()
    assert not left_over.exists() and not old.exists() and not old.with_name(old.name + ".size").exists()
    assert recent.exists()


class FakeJvm:
    """The gateway's Popen of a driver JVM that writes ``output`` when its stdin closes."""

    def __init__(self, output: Path | None, code: int = 0) -> None:
        self.output, self.code, self.returncode = output, code, None
        self.stdin = self

    def close(self) -> None:
        if self.output is not None:
            self.output.write_bytes(b"archive bytes")

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.code
        return self.code


def finished_build(cache: Path, monkeypatch: pytest.MonkeyPatch, usable: bool, code: int = 0) -> Any:
    _, build = archive.prepare({}, "")
    assert build is not None
    build._process = FakeJvm(build.temporary, code)
    build._java, build._class_path = "java", "cp"
    checked: list[Path] = []
    monkeypatch.setattr(build, "_usable", lambda path: checked.append(path) or usable)
    build.finish()
    assert build.lock_fd == -1, "the lock is released"
    assert not build.temporary.exists()
    return build, checked


def test_a_finished_build_is_checked_then_moved_into_place_with_its_size(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build, checked = finished_build(cache, monkeypatch, usable=True)
    assert checked == [build.temporary]
    assert build.archive.read_bytes() == b"archive bytes"
    assert archive.complete(build.archive)
    assert archive.prepare({}, "") == (f"-XX:SharedArchiveFile={build.archive}", None)


def test_an_unusable_or_failed_build_leaves_no_archive(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build, _ = finished_build(cache, monkeypatch, usable=False)
    assert not build.archive.exists()
    build, checked = finished_build(cache, monkeypatch, usable=True, code=1)
    assert not build.archive.exists() and checked == []


def test_the_session_appends_the_archive_option_to_the_callers_java_options(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMING_MERGE_CLASS_ARCHIVE", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    conf, build = session._session_conf("local[2]", {JAVA_OPTIONS: "-Dmine=1 -XX:+UseG1GC"}, short_run=True)
    assert build is not None
    options = conf[JAVA_OPTIONS].split(" ")
    assert options[:2] == ["-Dmine=1", "-XX:+UseG1GC"], "the caller's options come first, unchanged"
    assert "-XX:TieredStopAtLevel=1" in options and f"-XX:ArchiveClassesAtExit={build.temporary}" in options
    build.abandon()
    # Opted out, or a cluster master, or a JVM already running: no archive option.
    for kwargs in ({"class_archive": False}, {"starts_jvm": False}):
        conf, build = session._session_conf("local[2]", {JAVA_OPTIONS: "-Dmine=1"}, **kwargs)
        assert build is None and "Archive" not in conf[JAVA_OPTIONS] and "Shared" not in conf[JAVA_OPTIONS]
    conf, build = session._session_conf("yarn", {})
    assert build is None and JAVA_OPTIONS not in conf
    monkeypatch.setenv("STREAMING_MERGE_CLASS_ARCHIVE", "0")
    conf, build = session._session_conf("local[2]", {})
    assert build is None and "Archive" not in conf.get(JAVA_OPTIONS, "")


def test_java_options_of_spark_defaults_conf_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--conf`` of extraJavaOptions replaces spark-defaults.conf's: the file's options go first."""
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.memory 4g\n"
                                                  "spark.driver.extraJavaOptions   -Dfrom.file=1 -Xss4m\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session._defaults_file_java_options() == {JAVA_OPTIONS: "-Dfrom.file=1 -Xss4m"}
    conf, _ = session._session_conf("local[2]", {}, class_archive=False)
    assert conf[JAVA_OPTIONS] == "-Dfrom.file=1 -Xss4m"
    conf, _ = session._session_conf("local[2]", {JAVA_OPTIONS: "-Dgiven=1"}, class_archive=False)
    assert conf[JAVA_OPTIONS] == "-Dgiven=1", "a caller's own setting replaces the file's, as Spark does"
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions=-Dx=1\n")
    assert session._defaults_file_java_options() == {JAVA_OPTIONS: "-Dx=1"}
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    assert session._defaults_file_java_options() == {}


@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"), reason="needs a JVM")
def test_the_jvm_starts_without_a_stale_archive_and_the_build_check_refuses_a_truncated_one(tmp_path: Path) -> None:
    """HotSpot's own behaviour, which the design relies on: an archive of another class path is
    refused with a warning and the JVM starts (-Xshare:auto, the default); a truncated one is
    not refused but crashes the JVM, so only a checked archive of the recorded size is used."""
    java = str(archive.java_home() / "bin" / "java")
    jar = tmp_path / "app.jar"
    with zipfile.ZipFile(jar, "w") as content:
        content.writestr("Probe.class", base64.b64decode(PROBE_CLASS))
    made = tmp_path / "made.jsa"
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={made}", "-Xlog:cds*=error", "-cp", str(jar), "Probe"],
                   check=True, capture_output=True, timeout=120)
    assert made.stat().st_size > 0
    later = jar.stat().st_mtime + 10
    os.utime(jar, (later, later))  # the jar changed after the archive was made
    stale = subprocess.run([java, f"-XX:SharedArchiveFile={made}", "-cp", str(jar), "Probe"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert stale.returncode == 0, stale.stdout + stale.stderr
    assert "Unable to use shared archive" in stale.stdout + stale.stderr

    build = archive.Build(tmp_path / "final.jsa", -1)
    build._java, build._class_path = java, str(jar)
    assert not build._usable(made), "a stale archive does not pass the check either"
    os.utime(jar, (later - 10, later - 10))
    assert build._usable(made)
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(made.read_bytes()[: made.stat().st_size // 3])
    assert not build._usable(truncated)


def test_the_archive_path_is_the_one_the_session_would_build_or_map(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """session.class_archive_path names the archive local_session then builds (and, once built, maps),
    for the same master and options: what a warm-up step builds ahead of the JVMs that map it."""
    monkeypatch.delenv("STREAMING_MERGE_CLASS_ARCHIVE", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    given = {JAVA_OPTIONS: "-Dmine=1"}
    path = session.class_archive_path("local[2]", given)
    assert path is not None and path.parent == cache
    _, build = session._session_conf("local[2]", given, short_run=True)  # C1 does not change the key
    assert build is not None and build.archive == path
    build.abandon()
    assert session.class_archive_path("local[2]", {JAVA_OPTIONS: "-Dother=1"}) != path
    assert session.class_archive_path("yarn", given) is None
    assert session.class_archive_path("local[2]", given, class_archive=False) is None
    monkeypatch.setenv("STREAMING_MERGE_CLASS_ARCHIVE", "0")
    assert session.class_archive_path("local[2]", given) is None
