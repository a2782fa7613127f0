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

from support import SUPPORT
from support.counting_checks import check_store_on_disk, final_check
from support.killer import kill_counting_children

CHILD = SUPPORT / "counting_child.py"
COMBINATIONS = [
    ("at_least_once", "store"),
    ("exactly_once_v2", "store"),
    ("at_least_once", "checkpoint"),
    ("exactly_once_v2", "checkpoint"),
]


def run_kills(root: Path, guarantee: str, mode: str, kills_wanted: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    return kill_counting_children(
        rng,
        kills_wanted,
        lambda kill_at: [
            sys.executable,
            str(CHILD),
            str(root),
            guarantee,
            mode,
            str(rng.randrange(2**31)),
            str(kill_at),
            str(rng.choice([1, 7, 25])),
        ],
        lambda: check_store_on_disk(root) if mode == "store" else None,
        max_kill_at=120,
        startup=(0.02, 0.4),
        processing=(0, 0.15),
        timeout=20,
    )


@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_counting_processor_survives_sigkills(tmp_path: Path, guarantee: str, mode: str) -> None:
    stats = run_kills(
        tmp_path, guarantee, mode, kills_wanted=25, seed=zlib.crc32(f"{guarantee}/{mode}".encode())
    )
    print(f"{guarantee}/{mode}: {stats}")
    assert stats["kills"] >= 25
    assert stats["verified"] >= 3, f"too few children got through restart and restore to check: {stats}"
    store = final_check(tmp_path, guarantee, mode)
    assert int(store.get(b"__pos", b"0")) > 50, (
        "the children processed too little for the test to mean anything"
    )


@pytest.mark.torture
@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_counting_processor_torture(
    request: pytest.FixtureRequest, tmp_path: Path, guarantee: str, mode: str
) -> None:
    if "torture" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("500 kills per combination: select with -m torture (make torture)")
    stats = run_kills(tmp_path, guarantee, mode, kills_wanted=500, seed=random.randrange(2**31))
    print(f"{guarantee}/{mode}: {stats}")
    final_check(tmp_path, guarantee, mode)
