"""Shared fixtures: one local SparkSession per test session, temp table folders, and
markers assigned from the folder a test lives in (unit/, spark/, kafka/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

_FOLDER_MARKERS = {"spark": ("spark",), "kafka": ("kafka", "spark")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        for marker in _FOLDER_MARKERS.get(folder, ()):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from streaming_merge.session import local_session

    session = local_session("streaming_merge-tests", "local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture()
def table_path(tmp_path: Path) -> str:
    """A fresh folder path for a Delta table (not created yet)."""
    return str(tmp_path / "table")
