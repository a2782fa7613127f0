"""A restore job's new stores have their syncs deferred to the job's end; a crash before it leaves markers.

A child restores 32 new stores in one ``restore_many`` job and is SIGKILLed in
the middle of it (inside the tenth store's end). On disk every store of the
job has a marker of this boot beside it, whether its restore had finished,
was running, or had not begun. Then half the markers are made an earlier
boot's, as a machine that went down would leave them: opening such a store
is ``StoreCorruptedError``, and the next job wipes those stores and restores
them from the changelog's start, while it keeps the stores this boot's
markers stand beside (the process died, the kernel kept its writes) and
goes on from their offsets. Every store ends equal to its partition's
changelog, and no marker is left.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statestore import Store, StoreCorruptedError, TopicPartition, _native
from statestore.restore.engine import RestoreSpec, restore_many, restore_store
from support.model import store_contents
from support.restore_data import write_changelog

PARTITIONS = 32
KILLED_IN = 9  # the store whose restore end the child never returns from

CHILD = r"""
import sys, time
from pathlib import Path
from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many

root, log, n, stop_in = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

class StopAtEnd:
    def on_restore_start(self, tp, store_name, start, end): pass
    def on_batch_restored(self, tp, store_name, end_offset, count): pass
    def on_restore_end(self, tp, store_name, total):
        sys.stdout.write("stopped\n"); sys.stdout.flush()
        time.sleep(600)

specs = [
    RestoreSpec(root / f"0_{p}" / "rocksdb" / "s", log, TopicPartition("many", p), listener=StopAtEnd() if p == stop_in else None)
    for p in range(n)
]
restore_many(specs, threads=1)
sys.stdout.write("finished\n"); sys.stdout.flush()
"""


def store_of(root: Path, p: int) -> Path:
    return root / f"0_{p}" / "rocksdb" / "s"


def marker_of(store: Path) -> Path:
    return store.parent / f".{store.name}.unsynced"


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("deferred") / "log"
    write_changelog(d, "many", PARTITIONS, 2_000, 400)
    return d


def test_a_job_killed_midway_leaves_markers_and_the_next_job_keeps_or_wipes_each_store(
    tmp_path: Path, log: Path
) -> None:
    root = tmp_path / "state"
    for p in range(PARTITIONS):
        store_of(root, p).parent.mkdir(parents=True)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(log), str(PARTITIONS), str(KILLED_IN)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "stopped\n"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()

    # Every store of the job has its marker, of this boot: restored, restoring, or not begun.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for p in range(PARTITIONS):
        assert marker_of(store_of(root, p)).read_text() == boot, p
        assert _native.unsynced_marker(store_of(root, p)) == "this_boot"
    assert all((store_of(root, p) / "CURRENT").exists() for p in range(KILLED_IN))

    # The machine "went down": the odd stores' markers are an earlier boot's.
    for p in range(1, PARTITIONS, 2):
        marker_of(store_of(root, p)).write_text("00000000-0000-0000-0000-000000000000")
    with pytest.raises(StoreCorruptedError, match="cut short by the machine going down"):
        Store(store_of(root, 1))

    reference = tmp_path / "reference"
    reference.mkdir()
    whole = [
        restore_store(reference / str(p), log, TopicPartition("many", p)).records_applied
        for p in range(PARTITIONS)
    ]
    results = restore_many(
        [RestoreSpec(store_of(root, p), log, TopicPartition("many", p)) for p in range(PARTITIONS)], threads=2
    )
    for p, r in enumerate(results):
        assert r.error is None, r.error
        if p % 2:  # wiped, restored from the start
            assert (r.start_offset, r.records_applied) == (0, whole[p]), p
        elif p < KILLED_IN:  # finished before the kill, and kept
            assert r.records_applied == 0, p
        assert not marker_of(store_of(root, p)).exists(), p
        assert store_contents(store_of(root, p)).data == store_contents(reference / str(p)).data, p
        assert store_contents(store_of(root, p)).offsets == store_contents(reference / str(p)).offsets, p


def test_a_job_that_finishes_leaves_no_marker_and_a_store_opens_as_usual(tmp_path: Path, log: Path) -> None:
    specs = [RestoreSpec(tmp_path / f"0_{p}" / "s", log, TopicPartition("many", p)) for p in range(4)]
    for s in specs:
        Path(s.store_path).parent.mkdir()
    assert all(r.error is None for r in restore_many(specs, threads=2))
    assert not list(tmp_path.glob("*/.*.unsynced"))
    # A marker of this boot beside a store (its process died): the store is synced and kept.
    path = Path(specs[0].store_path)
    marker_of(path).write_text(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    expected = store_contents(path).data
    with Store(path) as store:
        assert dict(store) == expected
    assert not marker_of(path).exists()
