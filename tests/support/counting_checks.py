"""Checks of what a SIGKILLed counting processor (``support/counting_child.py``) left on disk.

Shared by the crash torture (``tests/processing/test_torture_crash.py``) and
the injected I/O faults (``tests/faults/test_io_faults.py``), which both run
that child over one state directory and changelog.
"""

from __future__ import annotations

from pathlib import Path

from statestore import SegmentLog, TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.state.directory import StateDirectory
from support.counting_child import STORE, check, model_from_log
from support.model import store_contents

TASK = TaskId(0, 0)
TP = TopicPartition(f"app-{STORE}-changelog", 0)


def committed_state_at(root: Path, offset: int) -> dict[bytes, bytes]:
    """The committed changelog's key -> value after applying records up to ``offset``."""
    state: dict[bytes, bytes] = {}
    for rec in SegmentLog(root / "log", sync=False).read(TP):
        if rec.offset > offset:
            break
        if rec.key is None:
            continue
        if rec.value is None:
            state.pop(rec.key, None)
        else:
            state[rec.key] = rec.value
    return state


def check_store_on_disk(root: Path) -> None:
    """Offsets in the store: what a kill left is exactly the committed state at the recorded offset."""
    store_dir = root / "state" / "app" / str(TASK) / "rocksdb" / STORE
    if not (store_dir / "CURRENT").exists():
        return
    contents = store_contents(store_dir)
    data, offsets = contents.data, contents.offsets
    offset = offsets.get(str(TP))
    if offset is None:
        assert not data, f"store holds {len(data)} keys but records no offset"
        return
    assert data == committed_state_at(root, offset), (
        f"store on disk is not the committed state at offset {offset}"
    )


def final_check(root: Path, guarantee: str, mode: str) -> dict[bytes, bytes]:
    """Restart in this process, restore, and compare with the committed changelog."""
    log = SegmentLog(root / "log", sync=False)
    with StateDirectory(root / "state", "app") as sd:
        tm = TaskManager(sd, log, [STORE], guarantee=guarantee, offsets=mode)
        tm.start()
        tm.assign([TASK], [])
        assert tm.restore(timeout=60)
        store = dict(tm.active_task(TASK).store(STORE))
        problem = check(store, model_from_log(root / "log"), eos=guarantee == "exactly_once_v2")
        assert problem is None, problem
        tm.close()
    return store


__all__ = ["TASK", "TP", "check_store_on_disk", "committed_state_at", "final_check"]
