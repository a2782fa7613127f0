"""Disk full and I/O errors during commit and restore (issue #9, items 2 and 4).

A child process works on a small world (see ``tests/support/badinput_support.py``)
until a write fails: ``RLIMIT_FSIZE`` (with ``SIGXFSZ`` ignored, so the write
fails with ``EFBIG`` as on a full disk), set at a chosen moment so the failure
hits a chosen file, or a tiny tmpfs that is full (``ENOSPC``) when this
machine lets tests mount one. The failure must be a ``statestore.errors``
exception (no crash, no hang). Then, in fresh processes without the limit:

1. the store as it is on disk (no restore) holds exactly the committed
   changelog up to the offset it records -- data and offset agree;
2. the changelog holds the last committed state (or, if the failure came after
   the changelog commit, that commit too -- nothing else); the task manager
   restores it and the store equals it;
3. the next commit (or restore) succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.badinput_cases import NOBODY, Outcome, chown_tree, run_child, traversable_tmpdir, unhex
from support.badinput_support import Model, build_world, build_worlds, partition_dir, store_dir, task_dir

pytestmark = pytest.mark.timeout(300)

WORLDS = {
    "eos-store": ("exactly_once_v2", "store"),
    "alos-store": ("at_least_once", "store"),
    "eos-ckpt": ("exactly_once_v2", "checkpoint"),
    "alos-ckpt": ("at_least_once", "checkpoint"),
}

#: Bytes of each value the child writes per record (8 records per commit).
VALUE_REPEAT = 20


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Model]]:
    """One clean world per flavour, built once."""
    return build_worlds(tmp_path_factory.mktemp, WORLDS)


def _copy(worlds: dict[str, tuple[Path, Model]], name: str, dest: Path) -> Path:
    shutil.copytree(worlds[name][0], dest, symlinks=True)
    return dest


def _spec(root: Path, world: str, action: str, **kw: Any) -> dict[str, Any]:
    guarantee, offsets = WORLDS[world]
    return {"root": str(root), "action": action, "guarantee": guarantee, "offsets": offsets, **kw}


def _fold(state: dict[bytes, bytes], ops: list[tuple[bytes, bytes | None]]) -> dict[bytes, bytes]:
    out = dict(state)
    for k, v in ops:
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def commit_ops(n: int, writes: int = 8) -> list[tuple[bytes, bytes | None]]:
    """The writes the child's commit ``n`` makes, in order (see ``act_manager``)."""
    ops: list[tuple[bytes, bytes | None]] = []
    for i in range(writes):
        key = f"new{n:03d}-{i:03d}".encode()
        ops.append((key, key * VALUE_REPEAT))
    if n % 2 == 1:
        ops.append((f"new{n - 1:03d}-000".encode(), None))
    return ops


def committed_count(outcome: Outcome) -> int:
    """How many commits the child reported done before it failed."""
    return sum(1 for line in outcome.stdout.splitlines() if line.startswith("committed "))


def assert_failed_cleanly(outcome: Outcome) -> dict[str, Any]:
    """The child ended in one of our exceptions: no crash, no hang, no foreign exception."""
    assert outcome.returncode == 0 and outcome.result is not None, f"crashed or hung: {outcome.describe()}"
    result = outcome.result
    assert not result["ok"], f"the write never failed (the limit missed): {outcome.describe()}"
    assert result["statestore"], f"not a statestore error: {outcome.describe()}"
    assert result["cls"] != "Hang", outcome.describe()
    return result


def assert_consistent(root: Path, world: str) -> dict[str, Any]:
    """The store on disk is readable and (offsets in the store) holds exactly the committed changelog
    up to the offset it records.

    With offsets in a checkpoint file the store's own offset is only where the
    restore engine stopped; the checkpoint is the authority, and recovery
    (:func:`assert_recovers`) shows what it vouches for.
    """
    outcome = run_child(_spec(root, world, "consistency"))
    assert outcome.result is not None and outcome.result["ok"], f"store not readable: {outcome.describe()}"
    r = outcome.result
    if WORLDS[world][1] == "checkpoint":
        return r
    assert unhex(r["store"]) == unhex(r["log_upto_offset"]), (
        f"the store disagrees with its own offset {r['offset']}: {outcome.describe()}"
    )
    if r["offset"] is not None:
        assert r["offset"] < r["log_offsets"][1], f"the store's offset is beyond the log's end: {r}"
    return r


def assert_recovers(root: Path, world: str, candidates: list[dict[bytes, bytes]]) -> None:
    """A fresh task manager restores one of ``candidates`` and commits again."""
    outcome = run_child(_spec(root, world, "manager", commits=1, value_repeat=VALUE_REPEAT))
    assert outcome.result is not None and outcome.result["ok"], f"no recovery: {outcome.describe()}"
    got = unhex(outcome.result["store"])
    assert got in candidates, f"restored a state that was never committed: {outcome.describe()}"
    assert outcome.result["committed"] == [0], outcome.describe()
    offsets = outcome.result["after_offsets"]
    assert all(off is not None for off in offsets.values()), offsets


# -- commit ---------------------------------------------------------------------------------------------

#: (world, what the limit hits, spec options). The limit is set after the first commit.
COMMIT_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("eos-store", "segment", {"fsize": 1000}),
    ("eos-store", "producer-state", {"fsize": 100}),
    ("eos-store", "store-wal", {"fsize": 17 * 1024, "commits": 14}),
    ("alos-store", "segment", {"fsize": 1000}),
    ("alos-store", "store-wal", {"fsize": 17 * 1024, "commits": 14}),
    ("eos-ckpt", "segment", {"fsize": 1000}),
    ("eos-ckpt", "producer-state", {"fsize": 100}),
    ("alos-ckpt", "segment", {"fsize": 1000}),
    ("alos-ckpt", "checkpoint", {"deny_task_dir": True, "manager_options": {"checkpoint_delta": 1}}),
]


@pytest.mark.parametrize(
    ("world", "target", "options"), COMMIT_CASES, ids=[f"{w}-{t}" for w, t, _ in COMMIT_CASES]
)
def test_commit_hits_disk_full(
    worlds: dict[str, tuple[Path, Model]], world: str, target: str, options: dict[str, Any]
) -> None:
    """A commit fails on ``target`` (see COMMIT_CASES); the previous committed state stays intact."""
    with traversable_tmpdir() as base:
        _commit_hits_disk_full(worlds, base / "w", world, options)


def _commit_hits_disk_full(
    worlds: dict[str, tuple[Path, Model]], root: Path, world: str, options: dict[str, Any]
) -> None:
    _copy(worlds, world, root)
    model = worlds[world][1]
    spec = _spec(root, world, "manager", commits=6, limit_after_commits=1, value_repeat=VALUE_REPEAT)
    spec.update(options)
    if spec.pop("deny_task_dir", False):
        # An I/O error on the checkpoint alone: after the first commit the child becomes a user
        # that may write everything but the task directory (where the checkpoint is replaced).
        chown_tree(root, NOBODY)
        os.chown(task_dir(root), 0, 0)
        task_dir(root).chmod(0o755)
        spec["drop_to"] = "nobody"
    outcome = run_child(spec)
    result = assert_failed_cleanly(outcome)
    done = committed_count(outcome)
    assert done >= 1, f"the limit hit before the first commit: {outcome.describe()}"
    print(f"{world}: commit {done} failed: {result['cls']}: {result['msg'][:300]}")
    assert_consistent(root, world)
    before = model.final
    for n in range(done):
        before = _fold(before, commit_ops(n))
    # The failed commit may have committed in the changelog before the store write failed;
    # at-least-once may also have flushed part of it: any prefix of its writes is possible.
    ops = commit_ops(done)
    candidates = [_fold(before, ops[:i]) for i in range(len(ops) + 1)]
    if world.startswith("eos"):
        candidates = [candidates[0], candidates[-1]]
    assert_recovers(root, world, candidates)


# -- restore --------------------------------------------------------------------------------------------

#: File size limits for restores: below what opening a store writes (its OPTIONS file is ~12 KB),
#: and between that and the store's data, so restores fail while writing data (SST, ingest, flush).
RESTORE_LIMITS = [2_000, pytest.param(24_000, marks=pytest.mark.torture), 64_000]


@pytest.fixture(scope="module")
def big_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Model]:
    """A larger changelog (about 700 KB, 2,000 keys), so restores write data well past the limits."""
    root = tmp_path_factory.mktemp("world-big")
    return root, build_world(
        root, "exactly_once_v2", "store", txns=12, txn_records=300, keys=2000, segment_bytes=256 * 1024
    )


@pytest.mark.parametrize("limit", RESTORE_LIMITS)
@pytest.mark.parametrize("mode", ["bulk", "replay"])
def test_restore_hits_disk_full(big_world: tuple[Path, Model], tmp_path: Path, mode: str, limit: int) -> None:
    """restore_store under a file size limit fails cleanly; the store keeps a committed prefix."""
    root = tmp_path / "w"
    shutil.copytree(big_world[0], root, symlinks=True)
    model = big_world[1]
    shutil.rmtree(task_dir(root))
    task_dir(root).mkdir(parents=True)
    if mode == "replay":
        # A store that already holds a committed prefix: restore resumes by replaying the tail.
        (store_dir(root)).parent.mkdir(parents=True, exist_ok=True)
        first = run_child(
            _spec(root, "eos-store", "restore", mode="bulk", end_offset=model.commits[1][0] + 1)
        )
        assert first.result is not None and first.result["ok"], first.describe()
    outcome = run_child(_spec(root, "eos-store", "restore", mode=mode, fsize=limit))
    assert outcome.returncode == 0 and outcome.result is not None, outcome.describe()
    if outcome.result["ok"]:
        pytest.fail(
            f"restore under a {limit}-byte limit succeeded; the limit is too high: {outcome.describe()}"
        )
    assert outcome.result["statestore"], outcome.describe()
    assert (
        str(store_dir(root)) in outcome.result["msg"] or str(partition_dir(root)) in outcome.result["msg"]
    ), outcome.describe()
    print(f"{mode}/{limit}: {outcome.result['cls']}: {outcome.result['msg'][:300]}")
    r = assert_consistent(root, "eos-store")
    if mode == "replay":
        assert r["offset"] is not None and r["offset"] >= model.commits[1][0], "the restored prefix was lost"
    else:
        # Bulk touches the store only by ingesting at the end: it is still empty, with no offset.
        assert r["offset"] is None and r["store"] == {}, r
    again = run_child(_spec(root, "eos-store", "restore", mode="auto"))
    assert again.result is not None and again.result["ok"], again.describe()
    assert unhex(again.result["store"]) == model.final


def test_task_manager_restore_disk_full_raises_not_loops(
    big_world: tuple[Path, Model], tmp_path: Path
) -> None:
    """A task manager whose restore keeps failing (full disk) raises after a few wipes instead of looping."""
    root = tmp_path / "w"
    shutil.copytree(big_world[0], root, symlinks=True)
    shutil.rmtree(task_dir(root))
    # The stores open (their OPTIONS file fits), then every restore fails writing its SST files.
    outcome = run_child(_spec(root, "eos-store", "manager", fsize=64_000, restore_timeout=20))
    result = assert_failed_cleanly(outcome)
    assert result["cls"] == "TaskCorruptedError", outcome.describe()
    assert "restoring failed 4 times in a row" in result["msg"], outcome.describe()
    assert str(store_dir(root)) in result["msg"], outcome.describe()
    assert_recovers(root, "eos-store", [big_world[1].final])


# -- a full filesystem (ENOSPC) ---------------------------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards; skipped where mounting is not allowed."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip()}); the RLIMIT_FSIZE cases cover disk full"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, leave: int) -> None:
    """Fill the filesystem at ``mnt`` until only about ``leave`` bytes are free."""
    import os

    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "filler", "wb") as f:
        f.write(bytes(max(0, free - leave)))


@pytest.mark.parametrize("on", ["state", "log"])
def test_commit_on_full_filesystem(
    worlds: dict[str, tuple[Path, Model]], tmp_path: Path, tiny_tmpfs: Path, on: str
) -> None:
    """The state directory (or the changelog) lives on a filesystem that fills up while committing."""
    root = _copy(worlds, "eos-store", tmp_path / "w")
    model = worlds["eos-store"][1]
    moved = root / on
    shutil.copytree(moved, tiny_tmpfs / on, symlinks=True)
    shutil.rmtree(moved)
    moved.symlink_to(tiny_tmpfs / on)
    _fill(tiny_tmpfs, 24 * 1024)
    outcome = run_child(_spec(root, "eos-store", "manager", commits=40, value_repeat=VALUE_REPEAT))
    result = assert_failed_cleanly(outcome)
    done = committed_count(outcome)
    print(f"{on} on a full tmpfs: commit {done} failed: {result['cls']}: {result['msg'][:300]}")
    (tiny_tmpfs / "filler").unlink()
    assert_consistent(root, "eos-store")
    before = model.final
    for n in range(done):
        before = _fold(before, commit_ops(n))
    assert_recovers(root, "eos-store", [before, _fold(before, commit_ops(done))])


@pytest.mark.parametrize("budget", [256 << 20, 256 << 10], ids=["sst-files", "spilled-runs"])
def test_bulk_restore_of_a_partition_larger_than_the_free_space(
    tmp_path: Path, tiny_tmpfs: Path, budget: int
) -> None:
    """A bulk restore whose output cannot fit (a 4 MB partition, a 1 MiB file system) fails naming the
    path, leaves the store as it was (new: empty with no offset, or not there at all) and gives the
    space back (its scratch directory is gone); with room, the same restore then succeeds.

    With the default budget the SST files fill the disk; with 256 KiB the sorted runs spilled
    beside the store do, before any SST file is written.
    """
    from statestore import TopicPartition
    from statestore._native import _testing
    from statestore.errors import StateStoreError
    from statestore.restore.engine import restore_store
    from support.model import store_contents

    log = tmp_path / "log"
    records = 32_000  # 127 bytes each on disk: ~4 MB, four times the file system
    _testing.write_synthetic_changelog(log, "big", 0, records, records)
    tp = TopicPartition("big", 0)
    free_before = shutil.disk_usage(tiny_tmpfs).free
    assert sum(f.stat().st_size for f in log.rglob("*.log")) > 3 * free_before
    store = tiny_tmpfs / "0_0" / "rocksdb" / "s"
    store.parent.mkdir(parents=True)
    with pytest.raises(StateStoreError) as e:
        restore_store(store, log, tp, mode="bulk", memory_budget_bytes=budget)
    print(f"{type(e.value).__name__}: {e.value}")
    assert str(tiny_tmpfs) in str(e.value), "the error names the path on the full file system"
    assert str(getattr(e.value, "path", "")).startswith(str(tiny_tmpfs)), f"path field: {e.value!r}"
    assert not any(p.name.endswith(".restore-tmp") for p in store.parent.iterdir()), "scratch left behind"
    if store.exists():
        left = store_contents(store)
        assert (left.data, left.offsets) == ({}, {}), "a failed bulk restore changed the store"
    # The space is given back: what is left is at most the empty store's own files.
    assert shutil.disk_usage(tiny_tmpfs).free > free_before - 256 * 1024
    # With room (the store moved to a roomy disk), the same restore succeeds.
    roomy = tmp_path / "roomy" / "s"
    roomy.parent.mkdir()
    if store.exists():
        shutil.copytree(store, roomy)
    r = restore_store(roomy, log, tp, mode="bulk", memory_budget_bytes=budget)
    assert r.records_applied == records and r.offset == records - 1


# A replay with RocksDB's compactions deferred to one merge at its end, under a file size limit that
# each level-0 file fits (256 KiB memtables) and the merged file does not.
DEFERRED_MERGE_CHILD = r"""
import json, resource, signal, sys
from statestore import TopicPartition, _native
from statestore.errors import StateStoreError
store, log, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    _native.restore_store(store, log, TopicPartition("big", 0), mode="replay", write_buffer_bytes=256 << 10,
                          chunk_bytes=64 << 10, defer_compactions_from=1)
    print(json.dumps({"ok": True}))
except StateStoreError as e:
    print(json.dumps({"ok": False, "cls": type(e).__name__, "msg": str(e)}))
"""


def test_a_deferred_merge_that_runs_out_of_disk_keeps_every_record_replayed(tmp_path: Path) -> None:
    """A replay of many offsets defers RocksDB's compactions to one merge at its end. When the merge
    cannot write (a 1 MiB file size limit: every level-0 file fits, the merged 4 MB file does not),
    the restore fails naming the store, which holds every record replayed with its offset; the store
    is then read as it is, and restored again without the limit (nothing left to replay)."""
    from statestore import TopicPartition
    from statestore._native import _testing
    from statestore.restore.engine import restore_store
    from support.model import store_contents

    log = tmp_path / "log"
    records = 32_000  # 127 bytes each on disk: ~4 MB
    _testing.write_synthetic_changelog(log, "big", 0, records, records)
    store = tmp_path / "s"
    out = subprocess.run(
        [sys.executable, "-c", DEFERRED_MERGE_CHILD, str(store), str(log), str(1 << 20)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    print(result)
    assert not result["ok"], "the merge fit under the limit: it must not"
    assert str(store) in result["msg"] and "compact" in result["msg"], result
    level0 = [f for f in store.glob("*.sst") if f.stat().st_size < 1 << 20]
    assert len(level0) > 8, "the replay's level-0 files are there, unmerged"
    left = store_contents(store)
    assert len(left.data) == records and left.offsets == {"big-0": records - 1}
    r = restore_store(store, log, TopicPartition("big", 0))
    assert (r.records_applied, r.offset) == (0, records - 1)
