"""Injected I/O errors: EIO and ENOSPC in the system calls of a processing child and of a restoring child.

``tests/faults/iofault.c`` is compiled (once, into ``~/.cache/statestore/``)
and preloaded into ``support/iofault_child.py``: libfiu failure points on
open, read, pread, write, pwrite, fsync, fdatasync, syncfs, rename, unlink and mmap of
the files under the run's directory fail with EIO or ENOSPC at random, at
most a few times per child. Each child restores and processes the counting
workload of the crash torture with the faults armed in one phase (restoring,
or processing); children run one after another on the same state directory
and changelog, so each starts from what the last one left.

Every run must end in a clear error -- a ``statestore.errors`` exception whose
message names a file under the run's directory -- or complete, with wipes and
restores where corruption was found; never a hang (a child has 60 s), never a
crash or an exception from outside the hierarchy. After every run, without
faults:

* offsets in the store: the store on disk is exactly the committed changelog's
  state at the offset it records (no offset claims more than the store holds);
* the next child restores and checks its store against the committed
  changelog before it arms its faults (exit status 3 otherwise), and at the end
  this process restores and checks once more: under exactly-once the store
  equals the committed changelog and every count matches the input; under
  at-least-once every committed update is there -- so no ``.checkpoint`` and no
  offset vouched for data the store did not hold.

The faults actually injected are counted per call site from the shim's log
(``<site> <errno> <file>`` per fault), with the eligible calls it saw.
``make test`` runs a few children per combination; ``make torture`` many
(``STATESTORE_IOFAULT_RUNS``); ``STATESTORE_IOFAULT_FIGURES=<file>`` appends
each combination's figures as a JSON line.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support import SUPPORT
from support.counting_checks import check_store_on_disk, final_check

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "iofault.c"
CHILD = SUPPORT / "iofault_child.py"
CACHE = Path(os.environ.get("STATESTORE_CACHE", Path.home() / ".cache" / "statestore")) / "iofault"
COMBINATIONS = [
    ("at_least_once", "store"),
    ("exactly_once_v2", "store"),
    ("at_least_once", "checkpoint"),
    ("exactly_once_v2", "checkpoint"),
]
EIO, ENOSPC = 5, 28
CHILD_TIMEOUT = 60


def build_shim() -> Path:
    """Compile the preload library into the cache (keyed by the source's hash); skip when it cannot be built."""
    source = SHIM_SOURCE.read_bytes()
    out = CACHE / f"iofault-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    reason = None
    if cc is None:
        reason = "no C compiler"
    elif not Path("/usr/include/fiu.h").exists():
        reason = (
            "libfiu is not installed (Debian fiu-utils libfiu-dev; scripts/setup-system.sh installs them)"
        )
    else:
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-Wno-format-truncation",
                "-o",
                str(tmp),
                str(SHIM_SOURCE),
                "-ldl",
                "-l:libfiu.so.0",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0:
            tmp.replace(out)
            return out
        reason = f"the fault shim did not compile: {proc.stderr[-2000:]}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def shim() -> Path:
    return build_shim()


def run_child(
    shim: Path, root: Path, guarantee: str, mode: str, phase: str, rng: random.Random, run_dir: Path
) -> dict[str, Any]:
    """One child with faults armed in ``phase``; returns its report plus the faults logged and calls seen."""
    log, calls = run_dir / "faults.log", run_dir / "calls.log"
    env = {
        **os.environ,
        "LD_PRELOAD": str(shim),
        "STATESTORE_FAULT_ROOT": str(root.resolve()),
        "STATESTORE_FAULT_LOG": str(log),
        "STATESTORE_FAULT_CALLS": str(calls),
        "STATESTORE_FAULT_PROB": str(rng.choice([0.01, 0.03, 0.1, 0.3])),
        "STATESTORE_FAULT_ERRNOS": rng.choice([f"{EIO}", f"{ENOSPC}", f"{EIO},{ENOSPC}"]),
        "STATESTORE_FAULT_MAX": str(rng.choice([1, 1, 2, 3])),
        "STATESTORE_FAULT_SEED": str(rng.randrange(2**31)),
    }
    args = [
        sys.executable,
        str(CHILD),
        str(root),
        guarantee,
        mode,
        phase,
        str(rng.randrange(2**31)),
        str(rng.choice([40, 150, 400])),
        str(rng.choice([1, 7, 25])),
    ]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"hang: a {phase} child under {guarantee}/{mode} did not finish in {CHILD_TIMEOUT} s; "
            f"faults: {log.read_text() if log.exists() else ''}; stderr: {e.stderr!r}"
        ) from e
    injected = [line.split(" ", 2) for line in log.read_text().splitlines()] if log.exists() else []
    seen: Counter[str] = Counter()
    if calls.exists():
        for line in calls.read_text().splitlines():
            site, n = line.rsplit(" ", 1)
            seen[site] += int(n)
    where = f"{phase} child under {guarantee}/{mode} (faults {injected})"
    assert proc.returncode == 0, f"{where} exited with {proc.returncode}: {proc.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["outcome"] != "foreign", f"{where}: exception outside statestore.errors: {report['error']}"
    assert report["faults"] == len(injected), (report, injected)
    if report["outcome"] == "error":
        message = report["error"]["message"] + " " + str(report["error"]["path"])
        assert str(root.resolve()) in message or str(root) in message, (
            f"{where}: error names no file: {report}"
        )
    report["injected"] = injected
    report["calls"] = seen
    return report


def file_kind(path: str) -> str:
    """What kind of file a fault hit, for the figures."""
    p = Path(path)
    name = p.name
    parts = set(p.parts)
    if name.endswith(".sst"):
        return "table file"
    if name.startswith("MANIFEST-"):
        return "MANIFEST"
    if name == "LOG" or name.startswith("LOG.old"):
        return "RocksDB info log"
    if name.startswith("OPTIONS-"):
        return "OPTIONS"
    if name == "rocksdict-config.json" or name in ("CURRENT", "IDENTITY", "LOCK"):
        return name
    if "rocksdb" in parts and name.endswith(".log"):
        return "RocksDB WAL"
    if name.endswith((".dbtmp", ".tmp")) and "rocksdb" in parts:
        return "RocksDB temp file"
    if name.startswith(".checkpoint"):
        return "checkpoint"
    if name == ".lock" or name.endswith(".lock"):
        return "lock file"
    if name.startswith("transactions.state"):
        return "producer state"
    if name.endswith(".log"):
        return "log segment"
    if name.endswith(".index") or ".index." in name:
        return "log index"
    if name.startswith("kafka-streams-process-metadata"):
        return "process metadata"
    if "." not in name or name == "rocksdb":
        return "directory"
    return name


def run_faults(shim: Path, root: Path, guarantee: str, mode: str, runs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {
        "guarantee": guarantee,
        "offsets": mode,
        "runs": 0,
        "faults": 0,
        "by_site": Counter(),
        "by_file": Counter(),
        "by_errno": Counter(),
        "outcomes": Counter(),
        "wipes": 0,
        "calls": Counter(),
        "absorbed": Counter(),
        "divergences": 0,
    }
    history: list[dict[str, Any]] = []
    for i in range(runs):
        phase = "restore" if i % 2 else "process"
        if phase == "restore" and rng.random() < 0.5:
            # a restoring child that rebuilds the whole task (bulk restore), not just the tail
            shutil.rmtree(root / "state" / "app" / "0_0", ignore_errors=True)
        run_dir = root.parent / f"{root.name}-run-{i}"
        run_dir.mkdir()
        try:
            report = run_child(shim, root, guarantee, mode, phase, rng, run_dir)
            if mode == "store":
                check_store_on_disk(root)
        except AssertionError as e:
            raise AssertionError(
                f"run {i} (seed {seed}) failed: {e}\nthe runs before it: {history[-3:]}"
            ) from e
        history.append(
            {k: report[k] for k in ("phase", "outcome", "error", "injected", "wipes") if k in report}
        )
        figures["runs"] += 1
        figures["faults"] += report["faults"]
        for site, err, path in report["injected"]:
            figures["by_site"][f"{phase} {site.rsplit('/', 1)[1]}"] += 1
            figures["by_file"][f"{site.rsplit('/', 1)[1]} {file_kind(path)}"] += 1
            figures["by_errno"]["EIO" if int(err) == EIO else "ENOSPC" if int(err) == ENOSPC else err] += 1
        if report["outcome"] == "completed" and report["faults"] and not report["wipes"]:
            for site, _err, path in report["injected"]:
                figures["absorbed"][f"{site.rsplit('/', 1)[1]} {file_kind(path)}"] += 1
        kind = report["outcome"] if report["faults"] else "no fault hit"
        if kind == "completed" and report["wipes"]:
            kind = "wiped and restored"
        elif kind == "completed":
            kind = "completed (fault absorbed)"
        if report["outcome"] == "error":
            kind = f"error: {report['error']['class']}"
        figures["outcomes"][f"{phase} {kind}"] += 1
        figures["wipes"] += report["wipes"]
        figures["calls"].update(report["calls"])
        shutil.rmtree(run_dir)
    final_check(root, guarantee, mode)  # raises on any divergence
    return figures


def _report(figures: dict[str, Any]) -> None:
    out = {k: dict(v) if isinstance(v, Counter) else v for k, v in figures.items()}
    print(json.dumps(out, sort_keys=True))
    dest = os.environ.get("STATESTORE_IOFAULT_FIGURES")
    if dest:
        with open(dest, "a") as f:
            f.write(json.dumps(out, sort_keys=True) + "\n")


@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_injected_io_errors(shim: Path, tmp_path: Path, guarantee: str, mode: str) -> None:
    figures = run_faults(
        shim, tmp_path / "w", guarantee, mode, runs=6, seed=zlib.crc32(f"io/{guarantee}/{mode}".encode())
    )
    _report(figures)
    assert figures["faults"] >= 3, f"too few faults were injected for the test to mean anything: {figures}"


@pytest.mark.torture
@pytest.mark.parametrize(("guarantee", "mode"), COMBINATIONS)
def test_injected_io_errors_torture(
    request: pytest.FixtureRequest, shim: Path, tmp_path: Path, guarantee: str, mode: str
) -> None:
    if "torture" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("many children per combination: select with -m torture (make torture)")
    runs = int(os.environ.get("STATESTORE_IOFAULT_RUNS", "60"))
    seed = int(os.environ.get("STATESTORE_IOFAULT_SEED", random.randrange(2**31)))
    figures = run_faults(shim, tmp_path / "w", guarantee, mode, runs=runs, seed=seed)
    _report(figures)
    assert figures["faults"] >= runs // 4


def run_armed_child(
    shim: Path, script: str, root: Path, log: Path, faulty: Path, sites: str, **env: str
) -> Any:
    """Run ``script`` (given ``root`` and ``log``) in a child with the shim preloaded, every call of
    ``sites`` on files under ``faulty`` failing once the child arms it; the JSON of its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root), str(log)],
        env={
            **os.environ,
            "LD_PRELOAD": str(shim),
            "STATESTORE_FAULT_ROOT": str(faulty.resolve()),
            "STATESTORE_FAULT_SITES": sites,
            "STATESTORE_FAULT_PROB": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


DEFERRED_CHILD = r"""
import ctypes, json, sys
from pathlib import Path
from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many
root, log = Path(sys.argv[1]), Path(sys.argv[2])
specs = [RestoreSpec(root / f"0_{p}" / "s", log, TopicPartition("t", p)) for p in range(4)]
ctypes.CDLL(None).statestore_fault_arm(1)
results = restore_many(specs, threads=2)
ctypes.CDLL(None).statestore_fault_arm(0)
print(json.dumps([None if r.error is None else str(r.error) for r in results]))
"""


def test_a_failed_sync_at_the_end_of_a_job_fails_its_new_stores_and_marks_them_for_a_wipe(
    shim: Path, tmp_path: Path
) -> None:
    """The job's first ``syncfs`` (its markers) passes, its last (its new stores) fails with EIO: each
    restore's error says its store is not durable and names it, and each marker now says the sync
    failed, since the kernel may have dropped any of the store's writes. ``Store`` refuses such a
    store, and the next job wipes each and restores it from the changelog's start."""
    from statestore import Store, TopicPartition, _native
    from statestore.errors import StoreCorruptedError
    from statestore.restore.engine import RestoreSpec, restore_many, restore_store
    from support.model import store_contents
    from support.restore_data import write_changelog

    log, root, reference = tmp_path / "log", tmp_path / "state", tmp_path / "reference"
    write_changelog(log, "t", 4, 1_000, 300)
    for p in range(4):
        (root / f"0_{p}").mkdir(parents=True)
    errors = run_armed_child(
        shim,
        DEFERRED_CHILD,
        root,
        log,
        root,
        sites="syncfs",
        STATESTORE_FAULT_SKIP="1",
        STATESTORE_FAULT_MAX="1",
    )
    for p, error in enumerate(errors):
        store = root / f"0_{p}" / "s"
        assert error is not None and "could not make it durable" in error and str(store) in error, error
        assert _native.unsynced_marker(store) == "sync_failed"
    with pytest.raises(StoreCorruptedError, match="a failed sync of its files"):
        Store(root / "0_0" / "s")
    reference.mkdir()
    results = restore_many(
        [RestoreSpec(root / f"0_{p}" / "s", log, TopicPartition("t", p)) for p in range(4)]
    )
    for p, r in enumerate(results):
        assert r.error is None and r.records_applied == 1_000, r  # wiped: restored from offset 0
        assert not (root / f"0_{p}" / ".s.unsynced").exists()
        restore_store(reference / str(p), log, TopicPartition("t", p))
        assert store_contents(root / f"0_{p}" / "s") == store_contents(reference / str(p))


LOST_CHILD = r"""
import ctypes, json, sys
from pathlib import Path
from statestore import TopicPartition
from statestore.restore.engine import OpenStores, RestoreSpec, restore_many
root, log = Path(sys.argv[1]), Path(sys.argv[2])
x, y = root / "x" / "s", root / "y" / "s"
home = OpenStores(3 << 20)
[rx] = restore_many([RestoreSpec(x, log, TopicPartition("big", 0), mode="replay")], threads=1, open_stores=home)
held_x = home.memtable_bytes()
ctypes.CDLL(None).statestore_fault_arm(1)
[ry] = restore_many([RestoreSpec(y, log, TopicPartition("small", 0), mode="replay")], threads=1, open_stores=home)
ctypes.CDLL(None).statestore_fault_arm(0)
out = {"x": None if rx.error is None else str(rx.error), "y": None if ry.error is None else str(ry.error),
       "x_offset": rx.offset, "held_x": held_x, "open": [str(p) for p in home.paths()]}
for i in (1, 2):
    try:
        out[f"flush_x_{i}"] = home.flush(x)
    except Exception as e:
        out[f"flush_x_{i}"] = f"{type(e).__name__}: {e}"
out["close_y"] = home.close(y)
print(json.dumps(out))
"""


def test_a_kept_store_whose_flush_fails_to_make_room_for_another_fails_its_own_next_flush(
    shim: Path, tmp_path: Path
) -> None:
    """Two stores kept open (the state updater's ``OpenStores``) whose memtables outgrow the budget when
    the second comes back: the first is flushed to make room, and that flush fails (EIO creating its
    table file). The first store is closed, with what it held unflushed lost: the second's restore
    does not take the blame, and the first's next flush raises the error (once) instead of saying
    quietly that no store was open, so its caller does not record an offset the disk does not hold."""
    from support.restore_data import write_changelog

    log, root = tmp_path / "log", tmp_path / "state"
    write_changelog(log, "big", 1, 10_000, 10_000)
    write_changelog(log, "small", 1, 5_000, 5_000)
    for name in ("x", "y"):
        (root / name).mkdir(parents=True)
    out = run_armed_child(shim, LOST_CHILD, root, log, root / "x", sites="open")
    x, y = root / "x" / "s", root / "y" / "s"
    assert out["x"] is None and out["x_offset"] == 9_999, out
    assert (3 << 20) // 2 < out["held_x"] <= 3 << 20, out  # kept unflushed, then the largest
    assert out["y"] is None, out  # the second store's restore is not failed by the first's flush
    assert out["open"] == [str(y.resolve())], out
    assert out["flush_x_1"].startswith("StoreError") and str(x) in out["flush_x_1"], out
    assert out["flush_x_2"] is False, out  # told once
    assert out["close_y"] is True, out
