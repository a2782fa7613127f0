"""Running the ``statestore`` command line in a child process, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys


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
