"""Damage to files, the child runner, and the checks every bad-input case ends with.

A case damages one file of a fresh copy of a world (see
:mod:`support.badinput_support`), runs one user-facing path in a child process
(:mod:`support.badinput_child`) and accepts exactly two endings:

* ``error``: an exception from ``statestore.errors`` whose message names the
  damaged file (for RocksDB files: the store directory);
* ``restored``: the path finished and the store equals the model -- the
  changelog's committed state (for damage to the changelog itself: a committed
  prefix of it, never anything else) -- and a commit afterwards worked.

Anything else fails: an exception from outside the hierarchy, a crash (signal
or non-zero exit without a result), a hang (the child's timeout), or a store
that differs from the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.badinput_support import Model, partition_dir, store_dir, task_dir

CHILD = Path(__file__).with_name("badinput_child.py")
#: Longest a child may run before the case counts as a hang.
CHILD_TIMEOUT = 60
NOBODY = 65534

#: Worlds: name -> (guarantee, offsets mode).
WORLDS = {
    "eos-store": ("exactly_once_v2", "store"),
    "eos-ckpt": ("exactly_once_v2", "checkpoint"),
    "alos-ckpt": ("at_least_once", "checkpoint"),
}


# -- finding the files of a world ------------------------------------------------------------


def _one(paths: list[Path], what: str) -> Path:
    if not paths:
        raise FileNotFoundError(f"no {what} in the world")
    return paths[0]


def segments(root: Path) -> list[Path]:
    """The ``.log`` segment files, in offset order."""
    return sorted(partition_dir(root).glob("*.log"))


def largest(paths: list[Path]) -> list[Path]:
    """``paths`` ordered largest first."""
    return sorted(paths, key=lambda p: p.stat().st_size, reverse=True)


#: File kind -> how to find it in a world.
FILES: dict[str, Callable[[Path], Path]] = {
    "checkpoint": lambda r: task_dir(r) / ".checkpoint",
    "segment-first": lambda r: segments(r)[0],
    "segment-last": lambda r: segments(r)[-1],
    "index": lambda r: segments(r)[0].with_suffix(".index"),
    "producer-state": lambda r: r / "log" / "transactions.state",
    "process-metadata": lambda r: r / "state" / "app" / "kafka-streams-process-metadata",
    "process-lock": lambda r: r / "state" / "app" / ".lock",
    "task-lock": lambda r: task_dir(r) / ".lock",
    "CURRENT": lambda r: store_dir(r) / "CURRENT",
    "MANIFEST": lambda r: _one(sorted(store_dir(r).glob("MANIFEST-*")), "MANIFEST"),
    "SST": lambda r: _one(largest(list(store_dir(r).glob("*.sst"))), "SST"),
    "OPTIONS": lambda r: _one(sorted(store_dir(r).glob("OPTIONS-*"))[::-1], "OPTIONS"),
    "rocksdict-config": lambda r: store_dir(r) / "rocksdict-config.json",
    "partition-dir": partition_dir,
    "store-dir": store_dir,
}


# -- damage ---------------------------------------------------------------------------------------


def truncate(path: Path) -> None:
    """Keep the first half of the file."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def zero_fill(path: Path) -> None:
    """Same length, every byte zero."""
    path.write_bytes(bytes(path.stat().st_size))


def random_bytes(path: Path) -> None:
    """64 random bytes over the middle of the file (the whole file if it is smaller than 128 bytes)."""
    data = bytearray(path.read_bytes())
    rng = random.Random(f"{path.name}-{len(data)}")
    if len(data) < 128:
        data = bytearray(rng.randbytes(max(len(data), 8)))
    else:
        mid = len(data) // 2
        data[mid : mid + 64] = rng.randbytes(64)
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    """Remove the file."""
    path.unlink()


def _replace_line(path: Path, index: int, line: str) -> None:
    lines = path.read_text().split("\n")
    lines[index] = line
    path.write_text("\n".join(lines))


def _patch(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def _sst_footer_version(path: Path) -> None:
    # Block-based table footer: ... format_version (4 bytes LE) then the 8-byte magic number.
    _patch(path, path.stat().st_size - 12, (99).to_bytes(4, "little"))


def _sst_footer_handles(path: Path) -> None:
    # The block handles before the version: varints that now claim an absurd offset and size.
    size = path.stat().st_size
    _patch(path, size - 53, b"\xff" * 9 + b"\x7f" + b"\xff" * 9 + b"\x7f")


def _options_version(path: Path) -> None:
    text = path.read_text()
    text = text.replace("options_file_version=1.1", "options_file_version=99.0")
    text = text.replace("rocksdb_version=", "rocksdb_version=99.0.0\n  old_rocksdb_version=", 1)
    path.write_text(text)


def _options_length(path: Path) -> None:
    text = path.read_text()
    text = text.replace("max_open_files=", f"max_open_files={2**62}\n  ignored_max_open_files=", 1)
    text = text.replace(
        "write_buffer_size=", f"write_buffer_size={2**64 + 7}\n  ignored_write_buffer_size=", 1
    )
    path.write_text(text)


#: (file kind, damage) -> specific damage for "wrong version" and "absurd length".
SPECIFIC: dict[tuple[str, str], Callable[[Path], None]] = {
    ("checkpoint", "wrong-version"): lambda p: _replace_line(p, 0, "1"),
    ("checkpoint", "absurd-length"): lambda p: _replace_line(p, 1, str(2**31 - 1)),
    ("checkpoint", "absurd-offset"): lambda p: _replace_line(
        p, 2, p.read_text().split("\n")[2].rsplit(" ", 1)[0] + f" {2**62}"
    ),
    # RecordBatch v2: baseOffset(8) batchLength(4) partitionLeaderEpoch(4) magic(1)
    ("segment-first", "wrong-version"): lambda p: _patch(p, 16, b"\x01"),
    ("segment-first", "absurd-length"): lambda p: _patch(p, 8, (2**31 - 1).to_bytes(4, "big")),
    ("segment-last", "wrong-version"): lambda p: _patch(p, 16, b"\x01"),
    ("segment-last", "absurd-length"): lambda p: _patch(p, 8, (2**31 - 1).to_bytes(4, "big")),
    ("index", "absurd-length"): lambda p: p.write_bytes(
        b"".join((i).to_bytes(4, "big") + (2**32 - 1 - i).to_bytes(4, "big") for i in range(1, 4))
        + b"\xff" * 4
    ),
    ("producer-state", "wrong-version"): lambda p: _replace_line(p, 0, "statestore-transactions 9"),
    ("producer-state", "absurd-length"): lambda p: _replace_line(
        p, 1, "next-producer-id 99999999999999999999999"
    ),
    ("process-metadata", "wrong-version"): lambda p: p.write_text(json.dumps({"processId": "v9:not-a-uuid"})),
    ("CURRENT", "wrong-version"): lambda p: p.write_text("MANIFEST-999999\n"),
    ("SST", "wrong-version"): _sst_footer_version,
    ("SST", "absurd-length"): _sst_footer_handles,
    ("OPTIONS", "wrong-version"): _options_version,
    ("OPTIONS", "absurd-length"): _options_length,
    ("rocksdict-config", "wrong-version"): lambda p: p.write_text(
        '{"raw_mode": "v99", "prefix_extractors": 7}'
    ),
}

GENERIC: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "zero-filled": zero_fill,
    "random-bytes": random_bytes,
    "deleted": delete,
}


def chown_tree(root: Path, uid: int) -> None:
    """Give the whole tree to ``uid`` (so a child running as that user can use it)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), uid, uid)
    os.chown(root, uid, uid)


@contextlib.contextmanager
def traversable_tmpdir() -> Iterator[Path]:
    """A temporary directory other users can traverse, removed afterwards.

    Permission cases give their tree to ``nobody``, who must reach it. pytest's
    own temporary directories will not do: every pytest session that starts
    meanwhile (another test run on the machine) makes ``/tmp/pytest-of-<user>``
    private again.
    """
    path = Path(tempfile.mkdtemp(prefix="statestore-badinput-"))
    try:
        path.chmod(0o711)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def deny(root: Path, path: Path) -> None:
    """The tree belongs to nobody except ``path``, which only root may read or write.

    ``root`` must be reachable by nobody (see :func:`traversable_tmpdir`).
    """
    chown_tree(root, NOBODY)
    os.chown(path, 0, 0)
    path.chmod(0o600)


# -- running a case ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the child reported (or that it reported nothing)."""

    returncode: int
    result: dict[str, Any] | None
    stdout: str
    stderr: str

    def describe(self) -> str:
        """For assertion messages."""
        return (
            f"exit {self.returncode}; result {json.dumps(self.result)[:3000]}; stderr {self.stderr[-3000:]}"
        )


def run_child(spec: dict[str, Any], timeout: float = CHILD_TIMEOUT) -> Outcome:
    """Run the child with ``spec``; a hang is an outcome too (returncode -999)."""
    try:
        proc = subprocess.run(
            [sys.executable, str(CHILD), json.dumps(spec)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return Outcome(-999, None, out, "hang: no result within the timeout")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    return Outcome(proc.returncode, result, proc.stdout, proc.stderr)


def unhex(d: dict[str, str]) -> dict[bytes, bytes]:
    """Inverse of the child's hex encoding."""
    return {bytes.fromhex(k): bytes.fromhex(v) for k, v in d.items()}


@dataclass
class Case:
    """One file kind x one damage, run through one path, with the ending it must have."""

    world: str
    file: str
    damage: str
    #: ``error`` or ``restored`` (``skipped``/``reported`` for offset sums).
    expect: str
    action: str = "manager"
    #: Remove the task directory first, so the path must restore everything from the changelog.
    fresh: bool = False
    #: The store may be any committed prefix of the changelog (damage to the changelog's tail).
    prefix_ok: bool = False
    #: Error class expected (name), when ``expect == "error"``.
    error_class: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """The pytest id."""
        suffix = "-fresh" if self.fresh else ""
        return f"{self.file}-{self.damage}-{self.world}-{self.action}{suffix}"


def prepare(
    case: Case, world_root: Path, root: Path, damage: Callable[[Path], None] | None = None
) -> tuple[dict[str, Any], Path]:
    """Copy the world to ``root``, damage the case's file and return the child's spec and the file."""
    shutil.copytree(world_root, root, symlinks=True)
    guarantee, offsets = WORLDS[case.world]
    if case.fresh:
        shutil.rmtree(task_dir(root))
    target = FILES[case.file](root) if case.file in FILES else store_dir(root)
    spec: dict[str, Any] = {
        "root": str(root),
        "action": case.action,
        "guarantee": guarantee,
        "offsets": offsets,
    }
    spec.update(case.extra)
    if damage is not None:
        damage(target)
    elif case.damage == "permission-denied":
        deny(root, target)
        spec["user"] = "nobody"
    elif (case.file, case.damage) in SPECIFIC:
        SPECIFIC[(case.file, case.damage)](target)
    else:
        GENERIC[case.damage](target)
    return spec, target


ROCKSDB_FILES = frozenset({"CURRENT", "MANIFEST", "SST", "OPTIONS", "rocksdict-config", "offsets-cf"})


def check(case: Case, outcome: Outcome, model: Model, target: Path) -> str:
    """Assert the case ended as it must; return ``error`` or ``restored``."""
    assert outcome.returncode == 0 and outcome.result is not None, (
        f"{case.id}: crashed or hung: {outcome.describe()}"
    )
    result = outcome.result
    if not result["ok"]:
        assert result["statestore"], f"{case.id}: not a statestore error: {outcome.describe()}"
        assert result["cls"] != "Hang", f"{case.id}: {outcome.describe()}"
        named = str(target.parent) if case.file in ROCKSDB_FILES - {"offsets-cf"} else str(target)
        if case.file == "store-dir":
            named = str(target.parent.parent)  # the task directory it could not wipe
        assert named in result["msg"], f"{case.id}: the error does not name {named}: {outcome.describe()}"
        if case.error_class is not None:
            assert result["cls"] == case.error_class, f"{case.id}: {outcome.describe()}"
        ending = "error"
    elif case.action == "offset_sums":
        # An assignor's question: a damaged task reports no sum (it holds no usable state).
        sums = result["sums"]
        assert sums.get("0_0") in (None, 0, model.commits[-1][0]), f"{case.id}: offset sum made up: {sums}"
        ending = "skipped" if not sums.get("0_0") else "reported"
    else:
        got = unhex(result["store"]) if "store" in result else model.final
        if case.prefix_ok:
            assert got in model.states(), f"{case.id}: the store is not a committed prefix of the changelog"
        else:
            assert got == model.final, f"{case.id}: the store differs from the changelog's model"
        if case.action == "manager":
            assert result["committed"], f"{case.id}: the commit after recovery did not happen"
        ending = "restored"
    assert ending == case.expect, f"{case.id}: expected {case.expect}, got {ending}: {outcome.describe()}"
    return ending
