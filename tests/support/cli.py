"""Running the ``statestore`` command line in a child process, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, input: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``python -m statestore.cli ARGS`` with its output captured as text, 250 columns wide (rich
    wraps nothing the assertions read)."""
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
    )


def restore_args(root: Path, app_id: str, *extra: str) -> list[str]:
    """``statestore restore`` from the segment log ``root/log`` into ``root/state`` for ``app_id``."""
    return [
        "restore",
        "--log-dir",
        str(root / "log"),
        "--state-dir",
        str(root / "state"),
        "--app-id",
        app_id,
        *extra,
    ]
