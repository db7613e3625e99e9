"""Where the Delta tables written by Delta Lake on Spark live (``shared/fixtures/delta-tables``).

The shared folder sits beside the project's checkout (``../shared``); a clone elsewhere (a fresh
clone in /tmp, as the before-stop check makes) finds it at the workplace's fixed ``/work/shared``.
``STREAMING_MERGE_DELTA_FIXTURES`` names another place. The tables are read-only: copy one
before writing to it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_CANDIDATES = [
    *([Path(os.environ["STREAMING_MERGE_DELTA_FIXTURES"])] if os.environ.get("STREAMING_MERGE_DELTA_FIXTURES") else []),
    Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "delta-tables",
    Path("/work/shared/fixtures/delta-tables"),
]


def delta_fixtures() -> Path:
    """The fixture tables' folder; raises (a test failure, not a skip) when none is found."""
    for candidate in _CANDIDATES:
        if (candidate / "table-with-dv-small" / "_delta_log").is_dir():
            return candidate
    raise FileNotFoundError(f"The Delta fixture tables are in none of {[str(c) for c in _CANDIDATES]}; "
                            "set STREAMING_MERGE_DELTA_FIXTURES to their folder.")


FIXTURES = delta_fixtures()


def fixture_copy(name: str, tmp_path: Path) -> Path:
    """A writable copy of fixture table ``name`` (shared/ is read-only in CI)."""
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    return copy
