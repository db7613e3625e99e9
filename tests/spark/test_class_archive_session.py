"""A local session with the driver class archive (streaming_merge.spark.class_archive), for real: the
first session of a key builds the archive when its process exits, the next one maps it and works.
Each session runs in a process of its own, with a cache folder of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming_merge.spark import class_archive as _class_archive

PROBE = """
from streaming_merge.session import local_session
spark = local_session("class-archive-test", "local[1]")
jvm = spark._jvm
print("ARGS", [a for a in jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
               if "Archive" in a])
print("VM", jvm.java.lang.System.getProperty("java.vm.info"))
print("COUNT", spark.range(10).selectExpr("sum(id) AS s").first()["s"])
spark.stop()
"""


def run_probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=900,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_the_first_local_session_builds_the_class_archive_and_the_next_one_maps_it(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SPARK_CONF_DIR"}
    env.update(STREAMING_MERGE_CACHE_DIR=str(tmp_path), STREAMING_MERGE_CLASS_ARCHIVE="1")

    first = run_probe(env)
    assert "-XX:ArchiveClassesAtExit=" in first.stdout and "COUNT 45" in first.stdout
    archives = sorted((tmp_path / "class-archives").glob("*.jsa"))
    assert len(archives) == 1, sorted(p.name for p in (tmp_path / "class-archives").iterdir())
    assert _class_archive.complete(archives[0])
    assert not list((tmp_path / "class-archives").glob("*.tmp")), "the temporary dump was moved into place"

    second = run_probe(env)
    assert f"-XX:SharedArchiveFile={archives[0]}" in second.stdout
    assert "sharing" in second.stdout and "COUNT 45" in second.stdout
    # The JVM warns on stdout when it cannot use an archive (and starts without it).
    assert "[warning][cds" not in second.stdout + second.stderr
