"""KAFKA-20685 end to end: no checkpoint may survive into RUNNING under exactly-once.

Under exactly-once with ``offsets="checkpoint"``, a task restores, turns
RUNNING, writes in a transaction that never commits, a background flush
persists those writes to RocksDB, and the process is SIGKILLed. On restart
the task must be wiped and restored, so the store holds no aborted data.

The pre-fix variant keeps the checkpoint written at restoration end (Kafka
4.2's behaviour) and has no status-marker check: the restart then trusts the
checkpoint, skips the wipe, and the aborted writes stay in the store -- which
this test detects, showing it would catch the bug.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statestore import SegmentLog, TaskId
from support import SUPPORT
from support.tasks import changelog_tp, produce

CHILD = SUPPORT / "aborted_writes_child.py"
TP = changelog_tp(TaskId(0, 0))


def run(root: Path, variant: str, phase: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(root), variant, phase], capture_output=True, text=True, timeout=120
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def scenario(root: Path, variant: str) -> tuple[bool, dict[str, Any]]:
    """Run crash then recover; return (checkpoint present while RUNNING, what recovery found)."""
    (root / "log").mkdir()
    produce(
        SegmentLog(root / "log"), TP, [(b"k%d" % i, b"committed") for i in range(10)], transactional_id="w"
    )
    code, out, err = run(root, variant, "crash")
    assert code == -signal.SIGKILL, f"the crash child did not die by SIGKILL ({code}):\n{err}"
    checkpoint_while_running = bool(out[0]["checkpoint"])
    code, out, err = run(root, variant, "recover")
    assert code == 0, err
    return checkpoint_while_running, out[0]


def aborted_data(store: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in store.items() if v == "ABORTED"}


@pytest.mark.parametrize("variant", ["fixed", "policy_only"])
def test_crash_while_running_wipes_and_keeps_no_aborted_data(tmp_path: Path, variant: str) -> None:
    checkpoint_while_running, recovered = scenario(tmp_path, variant)
    assert not checkpoint_while_running, "no .checkpoint may exist while RUNNING under exactly-once"
    assert recovered["start"] == 0, "the task was wiped and restored from the beginning"
    assert aborted_data(recovered["store"]) == {}
    assert recovered["store"] == {f"k{i}": "committed" for i in range(10)}


def test_pre_fix_behaviour_is_caught(tmp_path: Path) -> None:
    checkpoint_while_running, recovered = scenario(tmp_path, "pre_fix")
    assert checkpoint_while_running, (
        "pre-fix: the checkpoint written at restoration end survives into RUNNING"
    )
    assert recovered["start"] > 0, "pre-fix: the restart trusts that checkpoint and skips the wipe"
    assert aborted_data(recovered["store"]) == {f"k{i}": "ABORTED" for i in range(5)}, (
        "the check above must see the aborted writes the bug leaves behind"
    )
