"""Damaged store files are corruption: the task is wiped and restored, the others keep running.

A world of two tasks (``0_0``, ``0_1``), one store ``kv`` each, is processed
through a :class:`TaskManager` and closed cleanly, so each store is one data
table file, one offsets table file, a MANIFEST and the rest. Then one file of
task ``0_0``'s store is damaged the way disks damage files -- bytes flipped in
a data block, in the index block or in the footer of a table file, a table file
truncated or deleted while the MANIFEST lists it, bytes flipped in the MANIFEST
or in the offsets column family's table file, an offset of the wrong length --
and a new task manager starts, restores and reads every key of both tasks, as a
processor would.

What every case must show, under both guarantees:

* the damage surfaces as ``TaskCorruptedError`` (a ``StoreCorruptedError``
  from the store naming it and RocksDB's reason) wherever it is found --
  opening the store, a read, a commit, a flush, a compaction RocksDB ran in the
  background;
* the damaged task alone is wiped and restored from its changelog (its
  listener sees a full restore), the other task restores nothing and stays
  RUNNING throughout;
* afterwards both stores equal their committed changelogs, and the next
  commit works.

``statestore verify`` reports such a store as damaged with RocksDB's reason and
``statestore inspect`` shows it. The binding's mapping is tested directly too:
RocksDB's ``Corruption`` is ``StoreCorruptedError`` from the Rust side as well.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from statestore import SegmentLog, StoreCorruptedError, TaskCorruptedError, TaskId, TopicPartition, _native
from statestore.processing.task import TaskState
from statestore.processing.task_manager import TaskManager
from statestore.processing.updater import RestoreListener
from statestore.restore.engine import restore_store
from statestore.state.directory import StateDirectory
from statestore.state.store import Store
from support.cli import run_cli as _cli

APP = "app"
STORE = "kv"
DAMAGED = TaskId(0, 0)
HEALTHY = TaskId(0, 1)
TASKS = [DAMAGED, HEALTHY]
GUARANTEES = ["at_least_once", "exactly_once_v2"]
#: Keys per task and rounds of commits: enough for dozens of 4 KiB data blocks in the table file.
KEYS, ROUNDS = 700, 3


def tp_of(task: TaskId) -> TopicPartition:
    return TopicPartition(f"{APP}-{STORE}-changelog", task.partition)


def store_dir(root: Path, task: TaskId) -> Path:
    return root / "state" / APP / str(task) / "rocksdb" / STORE


def value(task: TaskId, i: int, rnd: int) -> bytes:
    return b"%d:%d:%d:" % (task.partition, i, rnd) + b"v" * 90


def key(i: int) -> bytes:
    return b"key-%06d" % i


def build_world(root: Path, guarantee: str) -> None:
    """Two tasks processed through a task manager and closed cleanly (every store flushed to table files)."""
    log = SegmentLog(root / "log", sync=False)
    with StateDirectory(root / "state", APP) as sd:
        tm = TaskManager(sd, log, [STORE], guarantee=guarantee)
        tm.start()
        tm.assign(TASKS, [])
        assert tm.restore(timeout=60)
        for rnd in range(ROUNDS):
            for task in TASKS:
                view = tm.active_task(task).store(STORE)
                for i in range(rnd, KEYS, 1 + rnd):
                    view.put(key(i), value(task, i, rnd))
                if rnd == ROUNDS - 1:
                    view.delete(key(KEYS - 1))
            tm.commit()
        tm.close()


def model(root: Path, task: TaskId) -> dict[bytes, bytes]:
    """The committed changelog's last value per key, read with the Python log reader (not the engine)."""
    out: dict[bytes, bytes] = {}
    for rec in SegmentLog(root / "log", sync=False).read(tp_of(task)):
        if rec.key is None:
            continue
        if rec.value is None:
            out.pop(rec.key, None)
        else:
            out[rec.key] = rec.value
    return out


# -- finding the parts of a table file (block-based table, format_version 6 or older) ---------------------------

FOOTER = 53  # every block-based table footer since format_version 1
TRAILER = 5  # compression type + checksum after every block


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = buf[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return out, i


def _block_entries(block: bytes) -> dict[bytes, bytes]:
    restarts = struct.unpack("<I", block[-4:])[0] & 0x7FFFFFFF
    end = len(block) - 4 - 4 * restarts
    out: dict[bytes, bytes] = {}
    i, last = 0, b""
    while i < end:
        shared, i = _varint(block, i)
        unshared, i = _varint(block, i)
        vlen, i = _varint(block, i)
        last = last[:shared] + block[i : i + unshared]
        i += unshared
        out[last] = block[i : i + vlen]
        i += vlen
    return out


def index_block(sst: Path) -> tuple[int, int]:
    """``(offset, size)`` of the table file's index block, from its footer (and metaindex block)."""
    data = sst.read_bytes()
    footer = data[-FOOTER:]
    version = struct.unpack("<I", footer[-12:-8])[0]
    if version >= 6:
        # checksum type, extended magic, footer checksum, base context checksum, metaindex size
        meta_size = struct.unpack("<I", footer[13:17])[0]
        start = len(data) - FOOTER - TRAILER - meta_size
        handle = _block_entries(data[start : start + meta_size])[b"rocksdb.index"]
        off, j = _varint(handle, 0)
        size, _ = _varint(handle, j)
        return off, size
    _meta_off, j = _varint(footer, 1)
    _meta_size, j = _varint(footer, j)
    off, j = _varint(footer, j)
    size, _ = _varint(footer, j)
    return off, size


def data_table(sdir: Path) -> Path:
    """The data column family's table file (the one holding the keys)."""
    tables = [p for p in sdir.glob("*.sst") if b"key-0" in p.read_bytes()]
    assert len(tables) == 1, f"expected one data table in {sdir}: {sorted(sdir.iterdir())}"
    return tables[0]


def offsets_table(sdir: Path) -> Path:
    """The offsets column family's newest table file (status marker, no data key): the one a lookup reads first."""
    tables = [p for p in sdir.glob("*.sst") if b"status" in p.read_bytes() and b"key-0" not in p.read_bytes()]
    assert tables, f"no offsets table in {sdir}: {sorted(sdir.iterdir())}"
    return max(tables, key=lambda p: int(p.stem))


def flip(path: Path, offset: int, n: int = 8) -> None:
    """Invert ``n`` bytes of ``path`` at ``offset`` (in place, same length)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))


def damage_data_block(sdir: Path) -> None:
    flip(data_table(sdir), 64)  # the first data block starts at byte 0


def damage_index_block(sdir: Path) -> None:
    sst = data_table(sdir)
    off, size = index_block(sst)
    assert off > 4096 and size > 16, (off, size)
    flip(sst, off + size // 2)


def damage_footer(sdir: Path) -> None:
    sst = data_table(sdir)
    flip(sst, sst.stat().st_size - FOOTER + 5, 4)  # the footer's own checksum


def truncate_table(sdir: Path) -> None:
    sst = data_table(sdir)
    os.truncate(sst, sst.stat().st_size // 2)


def delete_table(sdir: Path) -> None:
    data_table(sdir).unlink()  # the MANIFEST still lists it


def damage_manifest(sdir: Path) -> None:
    manifest = sdir / (sdir / "CURRENT").read_text().strip()
    flip(manifest, manifest.stat().st_size // 2, 16)


def damage_offsets_table(sdir: Path) -> None:
    sst = offsets_table(sdir)
    flip(sst, 16)  # the offsets family's only data block


def offset_of_wrong_length(sdir: Path) -> None:
    offsets = _native.store_dump(sdir).offsets
    assert offsets
    from rocksdict import Options, Rdict

    db = Rdict(str(sdir), Options(raw_mode=True), column_families={"offsets": Options(raw_mode=True)})
    cf = db.get_column_family("offsets")
    cf[str(tp_of(DAMAGED)).encode()] = b"\x00\x00\x00\x05"
    del cf
    db.close()


DAMAGES: dict[str, Callable[[Path], None]] = {
    "data-block": damage_data_block,
    "index-block": damage_index_block,
    "footer": damage_footer,
    "table-truncated": truncate_table,
    "table-deleted": delete_table,
    "manifest": damage_manifest,
    "offsets-table": damage_offsets_table,
    "offset-4-bytes": offset_of_wrong_length,
}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for g in GUARANTEES:
        root = tmp_path_factory.mktemp(f"world-{g}")
        build_world(root, g)
        out[g] = root
    return out


class Counting(RestoreListener):
    """Records restored per changelog partition."""

    def __init__(self) -> None:
        self.restored: dict[TopicPartition, int] = {}

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        self.restored[tp] = self.restored.get(tp, 0) + num_restored


def read_all(tm: TaskManager) -> dict[TaskId, dict[bytes, bytes]]:
    return {t: dict(tm.active_task(t).store(STORE)) for t in TASKS}


def process_until_clean(tm: TaskManager) -> tuple[dict[TaskId, dict[bytes, bytes]], list[str]]:
    """Restore and read every key of both tasks; corruption found while reading is handled as a stream thread does."""
    found: list[str] = []
    for _ in range(3):
        assert tm.restore(timeout=60)
        try:
            return read_all(tm), found
        except TaskCorruptedError as e:
            assert e.task_ids == frozenset({DAMAGED}), e.task_ids
            assert isinstance(e, StoreCorruptedError) and str(store_dir_of(tm, DAMAGED)) in str(e), e
            assert tm.active_task(HEALTHY).state is TaskState.RUNNING
            found.append(f"read: {e}")
            tm.handle_corruption(e.task_ids)
            assert tm.active_task(HEALTHY).state is TaskState.RUNNING, "the healthy task must keep running"
    raise AssertionError(f"still corrupted after handling it: {found}")


def store_dir_of(tm: TaskManager, task: TaskId) -> Path:
    return tm.directory.store_dir(task, STORE)


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_damaged_store_file_is_wiped_and_restored(
    worlds: dict[str, Path], tmp_path: Path, guarantee: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "w"
    shutil.copytree(worlds[guarantee], root)
    DAMAGES[damage](store_dir(root, DAMAGED))
    listener = Counting()
    log = SegmentLog(root / "log", sync=False)
    with StateDirectory(root / "state", APP) as sd:
        tm = TaskManager(sd, log, [STORE], guarantee=guarantee, listener=listener)
        tm.start()
        tm.assign(TASKS, [])
        stores, found = process_until_clean(tm)
        for task in TASKS:
            assert stores[task] == model(root, task), f"task {task} differs from its committed changelog"
        # the damaged task was restored in full, the healthy one not at all
        assert listener.restored.get(tp_of(DAMAGED), 0) >= len(model(root, DAMAGED)), listener.restored
        assert listener.restored.get(tp_of(HEALTHY), 0) == 0, listener.restored
        # and the next commit works
        tm.active_task(DAMAGED).store(STORE).put(b"after", b"1")
        tm.commit()
        tm.close()
    where = found or [r.getMessage() for r in caplog.records if "wiping" in r.getMessage()]
    assert where, "the damage was repaired without anyone saying so"
    print(f"{guarantee} {damage}: {where[0][:300]}")
    after = model(root, DAMAGED)
    assert after[b"after"] == b"1"


def _fill_and_flush(tm: TaskManager, rnd: int) -> None:
    view = tm.active_task(DAMAGED).store(STORE)
    for i in range(0, KEYS, 3):
        view.put(key(i), value(DAMAGED, i, 100 + rnd))
    tm.commit()
    tm.active_task(DAMAGED).state_manager.flush()


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_corruption_found_by_a_background_compaction(
    worlds: dict[str, Path], tmp_path: Path, guarantee: str
) -> None:
    """A damaged data block nobody reads is found by RocksDB's own compaction; the next write or flush says so."""
    root = tmp_path / "w"
    shutil.copytree(worlds[guarantee], root)
    damage_data_block(store_dir(root, DAMAGED))
    listener = Counting()
    log = SegmentLog(root / "log", sync=False)
    with StateDirectory(root / "state", APP) as sd:
        tm = TaskManager(sd, log, [STORE], guarantee=guarantee, listener=listener)
        tm.start()
        tm.assign(TASKS, [])
        assert tm.restore(timeout=60)
        assert not listener.restored, "the damage must not be found before the compaction"
        error: TaskCorruptedError | None = None
        deadline = time.monotonic() + 30
        rnd = 0
        while error is None and time.monotonic() < deadline:
            try:
                _fill_and_flush(tm, rnd)  # four table files in level 0 start a compaction
            except TaskCorruptedError as e:
                error = e
            rnd += 1
            time.sleep(0.05)
        assert error is not None, "no compaction reported the damaged block"
        assert DAMAGED in error.task_ids and HEALTHY not in error.task_ids, error
        assert "Corruption" in str(error) and str(store_dir(root, DAMAGED)) in str(error), error
        assert tm.active_task(HEALTHY).state is TaskState.RUNNING
        tm.handle_corruption(error.task_ids)
        stores, _found = process_until_clean(tm)
        for task in TASKS:
            assert stores[task] == model(root, task)
        assert listener.restored.get(tp_of(HEALTHY), 0) == 0
        tm.close()


# -- the binding: RocksDB's Corruption from the Rust side ------------------------------------------------------------


def test_rust_side_maps_corruption_to_store_corrupted_error(worlds: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(worlds["exactly_once_v2"], root)
    sdir = store_dir(root, DAMAGED)
    damage_data_block(sdir)
    _native.store_info(sdir)  # opening and reading offsets does not reach the data block
    with pytest.raises(StoreCorruptedError, match="Corruption") as e:
        _native.store_info(sdir, check_blocks=True)
    assert isinstance(e.value, TaskCorruptedError) and str(sdir) in str(e.value)
    with pytest.raises(StoreCorruptedError, match="Corruption"):
        _native.store_dump(sdir)
    truncate_table(sdir)
    with pytest.raises(StoreCorruptedError, match="Corruption"):
        _native.store_info(sdir)
    with pytest.raises(StoreCorruptedError, match="Corruption"):
        restore_store(sdir, root / "log", tp_of(DAMAGED), mode="replay")
    # an I/O error is not corruption: the store stays a StoreError only
    other = store_dir(root, HEALTHY)
    os.chmod(other, 0o000)
    try:
        if os.geteuid() != 0:
            with pytest.raises(Exception) as e2:
                _native.store_info(other)
            assert not isinstance(e2.value, TaskCorruptedError)
    finally:
        os.chmod(other, 0o755)


def test_python_store_names_the_task_of_a_damaged_block(worlds: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(worlds["at_least_once"], root)
    sdir = store_dir(root, DAMAGED)
    damage_data_block(sdir)
    s = Store(sdir, task_id=DAMAGED)
    try:
        with pytest.raises(StoreCorruptedError) as e:
            s.get(key(0))
        assert e.value.task_ids == frozenset({DAMAGED}) and e.value.path == str(sdir)
        assert "block checksum mismatch" in str(e.value) or "Corruption" in str(e.value)
        with pytest.raises(StoreCorruptedError):
            list(s.range())
    finally:
        s.close(clean=False)


# -- the statestore command --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["data-block", "index-block", "offsets-table"])
def test_verify_and_inspect_report_a_damaged_store(
    worlds: dict[str, Path], tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "w"
    shutil.copytree(worlds["exactly_once_v2"], root)
    DAMAGES[damage](store_dir(root, DAMAGED))
    args = ["--state-dir", str(root / "state"), "--app-id", APP, "--log-dir", str(root / "log")]
    v = _cli("verify", *args)
    assert "Traceback" not in v.stderr, v.stderr
    assert v.returncode == 1, (v.stdout, v.stderr)
    text = " ".join((v.stdout + v.stderr).split())
    assert "DAMAGED" in text and "damaged: task 0_0 store kv" in text and "Corruption" in text, text
    assert "exact" in text, "the healthy store is still verified"
    i = _cli("inspect", *args)
    assert i.returncode == 0 and "Traceback" not in i.stderr, (i.stdout, i.stderr)
    shown = "".join((i.stdout + i.stderr).split())
    assert "damaged" in shown and "Corruption" in shown, shown
    quick = _cli("inspect", "--quick", *args)
    if damage == "data-block":
        assert "Corruption" not in "".join(quick.stdout.split()), "--quick reads no data block"
