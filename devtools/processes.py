"""What the throwaway servers of devtools share: the tail of their log, and stopping the
process group each runs in."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a server's log, or nothing when it has none yet."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def stop_group(process: subprocess.Popen[bytes] | None, timeout_s: float = 20) -> None:
    """SIGTERM to ``process``'s group, SIGKILL when it has not ended within ``timeout_s``."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL to ``process``'s group (a crash, not a stop), and wait for it."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
