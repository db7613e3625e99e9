"""A local session with the driver class archive (streaming_merge.spark.class_archive), for real: the
first session of a key builds the archive when its process exits, the next one maps it and works.
Each session runs in a process of its own.

Where this test session's warm-up (tests/conftest.py::driver_class_archive) was itself the first
session of its key, as in every fresh CI run, its build is the first session checked here and
only the next one is started (one JVM life of ~30 s less); otherwise both run with a cache
folder of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming_merge.spark import class_archive as _class_archive
from tests.conftest import WarmedArchive

PROBE = """
from streaming_merge.session import local_session
from tests.streaming_support.class_archive_warmup import archive_options
spark = local_session("class-archive-test", "local[2]")
print("ARGS", archive_options(spark))
print("VM", spark._jvm.java.lang.System.getProperty("java.vm.info"))
print("COUNT", spark.range(10).selectExpr("sum(id) AS s").first()["s"])
spark.stop()
"""
ROOT = Path(__file__).resolve().parents[2]


def run_probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_the_first_local_session_builds_the_class_archive_and_the_next_one_maps_it(
        tmp_path: Path, driver_class_archive: WarmedArchive | None) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SPARK_CONF_DIR"}
    env.update(STREAMING_MERGE_CLASS_ARCHIVE="1", PYTHONPATH=str(ROOT))
    warmed = driver_class_archive
    # The warm-up ran with this process's environment: the probe's key is its key unless the
    # probe's environment differs (no SPARK_CONF_DIR).
    if warmed is not None and warmed.build_output is not None and "SPARK_CONF_DIR" not in os.environ:
        first_output, archive = warmed.build_output, warmed.path
    else:
        env.update(STREAMING_MERGE_CACHE_DIR=str(tmp_path))
        first = run_probe(env)
        first_output = first.stdout
        assert "COUNT 45" in first.stdout
        archives = sorted((tmp_path / "class-archives").glob("*.jsa"))
        assert len(archives) == 1, sorted(p.name for p in (tmp_path / "class-archives").iterdir())
        archive = archives[0]
    assert "-XX:ArchiveClassesAtExit=" in first_output, first_output
    assert _class_archive.complete(archive)
    assert not list(archive.parent.glob(f"{archive.name}*.tmp")), "the temporary dump was moved into place"

    second = run_probe(env)
    assert f"-XX:SharedArchiveFile={archive}" in second.stdout
    assert "sharing" in second.stdout and "COUNT 45" in second.stdout
    # The JVM warns on stdout when it cannot use an archive (and starts without it).
    assert "[warning][cds" not in second.stdout + second.stderr
