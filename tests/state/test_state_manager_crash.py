"""Crash tests: a child process processes and commits, and is SIGKILLed at random points.

For each (guarantee, offsets mode) a fresh interpreter runs ``helpers_crash.py``:
it restores task 0_0 from a model changelog, then processes transactions until
it is killed -- by this process at a random moment after it is ready, or by
itself at a random step (some steps sit exactly between the changelog commit
and the store commit). After every kill the files on disk are checked:

* the recorded offset (store column family, or ``.checkpoint``) never claims
  data the store lacks;
* under exactly-once the store never holds data from an aborted or uncommitted
  transaction, and with offsets in the store it is *exactly* the committed
  changelog state at its offset -- recovery never needs a wipe;
* under exactly-once with a checkpoint, a crash while RUNNING leaves no
  checkpoint, and the next start wipes (``TaskCorruptedError``).

The next child then starts on what the previous one left behind, so recovery
itself is killed too.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, TaskCorruptedError, TaskId, TopicPartition
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from statestore.state.state_manager import StateManager
from support import SUPPORT
from support.model import store_contents
from support.state_manager_child import TOPIC_PARTITION, Changelog, check_invariants

CHILD = SUPPORT / "state_manager_child.py"
TP = TopicPartition(*TOPIC_PARTITION)
TASK = TaskId(0, 0)
COMBINATIONS = [
    ("at_least_once", "store"),
    ("exactly_once_v2", "store"),
    ("at_least_once", "checkpoint"),
    ("exactly_once_v2", "checkpoint"),
]


def on_disk(root: Path, mode: str) -> tuple[dict[bytes, bytes], int | None, bool]:
    """(store content, recorded offset, checkpoint file present) as the crash left them."""
    app = root / "app"
    store_dir = app / str(TASK) / "rocksdb" / "s"
    store: dict[bytes, bytes] = {}
    store_offsets: dict[str, int] = {}
    if (store_dir / "CURRENT").exists():
        contents = store_contents(store_dir)
        store, store_offsets = contents.data, contents.offsets
    ckpt = OffsetCheckpoint(app / str(TASK) / ".checkpoint")
    if mode == "store":
        return store, store_offsets.get(str(TP)), ckpt.exists()
    return store, ckpt.read().get(TP), ckpt.exists()


def run_crashes(root: Path, guarantee: str, mode: str, kills_wanted: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    eos = guarantee == "exactly_once_v2"
    stats = {
        "kills": 0,
        "self_kills": 0,
        "runs": 0,
        "corrupted": 0,
        "checkpoint_after_kill": 0,
        "killed_running": 0,
    }
    while stats["kills"] < kills_wanted:
        stats["runs"] += 1
        assert stats["runs"] < kills_wanted * 3, f"children keep failing: {stats}"
        self_kill = rng.random() < 0.5
        kill_at = rng.randint(1, 40) if self_kill else -1
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(root), guarantee, mode, str(rng.randrange(2**31)), str(kill_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        if not self_kill:
            first = proc.stdout.readline()  # "corrupted" or "running"
            if first.strip() == "corrupted":
                first += proc.stdout.readline()
            time.sleep(rng.uniform(0, 0.02))
            proc.send_signal(signal.SIGKILL)
        else:
            first = ""
        proc.wait()
        lines = (first + proc.stdout.read()).split()
        stderr = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert proc.returncode in (-signal.SIGKILL, 0), f"child failed ({proc.returncode}):\n{stderr}"
        if proc.returncode == -signal.SIGKILL:
            stats["kills"] += 1
            stats["self_kills"] += self_kill
        stats["corrupted"] += lines.count("corrupted")
        store, claimed, has_ckpt = on_disk(root, mode)
        check_invariants(
            store, claimed, Changelog.read(root / "changelog.txt"), eos=eos, exact=eos and mode == "store"
        )
        stats["checkpoint_after_kill"] += has_ckpt
        phases = [ln for ln in lines if ln in ("running", "leaving")]
        if eos and mode == "checkpoint" and phases and phases[-1] == "running":
            stats["killed_running"] += 1
            assert not has_ckpt, "guarantee 2: a .checkpoint exists while the task is RUNNING under EOS"
    return stats


@pytest.mark.slow
@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_sigkill_at_random_points(tmp_path: Path, guarantee: str, mode: str) -> None:
    stats = run_crashes(
        tmp_path, guarantee, mode, kills_wanted=50, seed=zlib.crc32(f"{guarantee}/{mode}".encode())
    )
    print(f"{guarantee}/{mode}: {stats}")
    assert stats["kills"] >= 50
    log = Changelog.read(tmp_path / "changelog.txt")
    assert len(log.records) > 100, "the children did too little work for the test to mean anything"
    if mode == "store" or guarantee == "at_least_once":
        assert stats["corrupted"] == 0, "offsets kept with the data (or ALOS) never need a wipe"
    else:
        assert stats["corrupted"] > 0, "EOS with a checkpoint: a crash while RUNNING must lead to a wipe"
        assert stats["killed_running"] >= 3, "too few kills hit a RUNNING task to check guarantee 2"
    # whatever the last crash left, a clean start recovers without help
    with StateDirectory(tmp_path, "app") as sd:
        sm = StateManager(sd, TASK, Policy.of(guarantee, mode))
        sm.register("s")
        try:
            sm.initialize()
        except TaskCorruptedError:
            assert guarantee == "exactly_once_v2" and mode == "checkpoint"
            sm.wipe()
            sm.initialize()
        sm.close(clean=False)


@pytest.mark.torture
@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_sigkill_torture(tmp_path: Path, guarantee: str, mode: str) -> None:
    stats = run_crashes(tmp_path, guarantee, mode, kills_wanted=500, seed=random.randrange(2**31))
    print(f"{guarantee}/{mode}: {stats}")
