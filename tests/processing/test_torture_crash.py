"""Crash torture: a counting processor on a TaskManager, SIGKILLed at random points, real processes.

For each (guarantee, offsets mode) a fresh interpreter runs
``support/counting_child.py`` over the same state directory and changelog, again
and again, and every run is SIGKILLed -- by itself at a random step (restore
batches, both sides of the changelog commit, store writes, flushes, checkpoint
writes, closes) or by this process at a random moment (during start-up and
restoration, or while processing).

Checked after every kill, on disk:

* offsets in the store: the store is exactly the committed changelog's state
  at the offset it records (a committed prefix with its exact offset);

and by every next child after restart and restore (it exits with status 3
otherwise), and once more here at the end:

* exactly-once: the store equals the model built from the committed changelog
  exactly, and every count matches the input up to the recorded position;
* at-least-once: the store holds every committed update.
"""

from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

import pytest

from statestore import SegmentLog, TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.state.directory import StateDirectory
from support import SUPPORT
from support.counting_child import STORE, check, model_from_log
from support.killer import kill_counting_children
from support.model import store_contents

CHILD = SUPPORT / "counting_child.py"
TASK = TaskId(0, 0)
TP = TopicPartition(f"app-{STORE}-changelog", 0)
COMBINATIONS = [
    ("at_least_once", "store"),
    ("exactly_once_v2", "store"),
    ("at_least_once", "checkpoint"),
    ("exactly_once_v2", "checkpoint"),
]


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
    assert data == committed_state_at(root, offset), f"store on disk is not the committed state at offset {offset}"


def run_kills(root: Path, guarantee: str, mode: str, kills_wanted: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    return kill_counting_children(
        rng, kills_wanted,
        lambda kill_at: [sys.executable, str(CHILD), str(root), guarantee, mode, str(rng.randrange(2**31)),
                         str(kill_at), str(rng.choice([1, 7, 25]))],
        lambda: check_store_on_disk(root) if mode == "store" else None,
        max_kill_at=120, startup=(0.02, 0.4), processing=(0, 0.15), timeout=20,
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


@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_counting_processor_survives_sigkills(tmp_path: Path, guarantee: str, mode: str) -> None:
    stats = run_kills(tmp_path, guarantee, mode, kills_wanted=25, seed=zlib.crc32(f"{guarantee}/{mode}".encode()))
    print(f"{guarantee}/{mode}: {stats}")
    assert stats["kills"] >= 25
    assert stats["verified"] >= 3, f"too few children got through restart and restore to check: {stats}"
    store = final_check(tmp_path, guarantee, mode)
    assert int(store.get(b"__pos", b"0")) > 50, "the children processed too little for the test to mean anything"


@pytest.mark.torture
@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_counting_processor_torture(request: pytest.FixtureRequest, tmp_path: Path, guarantee: str, mode: str) -> None:
    if "torture" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("500 kills per combination: select with -m torture (make torture)")
    stats = run_kills(tmp_path, guarantee, mode, kills_wanted=500, seed=random.randrange(2**31))
    print(f"{guarantee}/{mode}: {stats}")
    final_check(tmp_path, guarantee, mode)
