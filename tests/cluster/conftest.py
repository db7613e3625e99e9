"""Fixtures of the local-cluster tier (tests here are auto-marked ``cluster`` and ``slow``).

Every test runs its workload in a subprocess on ``local-cluster[2,1,1024]`` (see apps.py);
``launch`` starts those apps and ends any still running when the test finishes, so a failed
assertion never leaves a driver and its executor JVMs behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.apps import App, start_app


@pytest.fixture()
def launch(tmp_path: Path) -> Iterator[Callable[[str, list[str]], App]]:
    """``launch(module, args) -> App``: start a support app; ended (if still running) at teardown."""
    started: list[App] = []

    def start(module: str, args: list[str]) -> App:
        app = start_app(module, args, tmp_path)
        started.append(app)
        return app

    yield start
    for app in started:
        app.end()
