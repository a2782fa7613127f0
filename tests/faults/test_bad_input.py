"""Bad-input suite: every file statestore reads, damaged every typical way (issue #9, item 2).

Each case copies a small world (a changelog and a task restored from it, see
``tests/support/badinput_support.py``), damages one file, and runs a
user-facing path in a child process: the task manager's start, assign,
restore, read and commit (``manager``), ``restore_store`` (``restore``),
``SegmentLog.read`` (``read_log``), a transactional producer (``produce``) or
the ``statestore`` command. A case ends either in a ``statestore.errors``
exception naming the damaged file, or with the store equal to the changelog's
model and a commit working afterwards -- each case pins which (see
``docs/reliability.md``). A crash, a hang, a foreign exception or a
store that differs from the model fails the case.

The children run a few at a time from one module fixture, so the suite takes
a fraction of its serial time; each case is still its own test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from statestore.state.store import OFFSETS_CF, STATUS_KEY
from support.badinput_cases import WORLDS, Case, Outcome, check, prepare, run_child, traversable_tmpdir
from support.badinput_support import TP, Model, build_worlds, store_dir

pytestmark = pytest.mark.timeout(300)

E, R = "error", "restored"
T, Z, X, V, L, D, P = (
    "truncated",
    "zero-filled",
    "random-bytes",
    "wrong-version",
    "absurd-length",
    "deleted",
    "permission-denied",
)


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(file: str, world: str, expected: dict[str, str], **kw: Any) -> None:
        for damage, expect in expected.items():
            c.append(Case(world, file, damage, expect, **kw))

    # -- the checkpoint file (offsets="checkpoint") --
    for world in ("alos-ckpt", "eos-ckpt"):
        add("checkpoint", world, {T: E, Z: E, X: E, V: E, L: E, "absurd-offset": R, D: R, P: E})
    # -- changelog segments --
    seg_first = {T: E, Z: E, X: E, V: E, L: E, D: R, P: E}
    add("segment-first", "eos-store", seg_first, fresh=True)
    add("segment-first", "eos-store", seg_first, action="read_log", fresh=True)
    add("segment-first", "eos-store", seg_first, action="restore", fresh=True)
    seg_last = {T: R, Z: E, X: E, V: E, L: E, D: R, P: E}
    add("segment-last", "eos-store", seg_last, prefix_ok=True)
    add("segment-last", "eos-store", seg_last, prefix_ok=True, fresh=True)
    add("index", "eos-store", {T: R, Z: R, X: R, L: R, D: R, P: R}, fresh=True)
    # -- producer state (transactions.state) --
    txn = {T: E, Z: E, X: E, V: E, L: E, D: R, P: E}
    add("producer-state", "eos-store", txn)
    add("producer-state", "eos-store", txn, action="produce")
    # -- state directory files --
    add("process-metadata", "eos-store", {T: R, Z: R, X: R, V: R, D: R, P: R})
    add("process-lock", "eos-store", {Z: R, X: R, D: R, P: E})
    add("task-lock", "eos-store", {X: R, D: R, P: E})
    # -- the store's RocksDB files --
    add("CURRENT", "eos-store", {T: R, Z: R, X: R, V: R, D: R, P: R})
    add("MANIFEST", "eos-store", {T: R, Z: R, X: R, D: R, P: R})
    add("SST", "eos-store", {T: R, Z: R, X: R, V: R, L: R, D: R, P: R})
    add("OPTIONS", "eos-store", {T: R, Z: R, X: R, V: R, L: R, D: R, P: R})
    add("rocksdict-config", "eos-store", {T: R, Z: R, X: R, V: R, D: R, P: R})
    for damage in OFFSETS_DAMAGE:
        c.append(Case("eos-store", "offsets-cf", damage, R))
    # -- directories nobody may enter --
    add("partition-dir", "eos-store", {P: E})
    add("partition-dir", "eos-store", {P: E}, action="read_log")
    add("store-dir", "eos-store", {P: E})
    # -- what an assignor asks of unowned task directories: offset sums --
    S = "skipped"
    add("checkpoint", "alos-ckpt", {T: S, X: S, D: S, P: S}, action="offset_sums")
    for file in ("CURRENT", "MANIFEST", "SST"):
        add(file, "eos-store", {T: S, Z: S, D: S, P: S}, action="offset_sums")
    c.append(Case("eos-store", "offsets-cf", "offset-4-bytes", S, action="offset_sums"))
    return c


def _put_offsets(path: Path, key: bytes, value: bytes) -> None:
    db = Rdict(str(path), Options(raw_mode=True), column_families={OFFSETS_CF: Options(raw_mode=True)})
    try:
        cf = db.get_column_family(OFFSETS_CF)
        cf[key] = value
        del cf
    finally:
        db.close()


def _offset(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


_TPK = str(TP).encode()
#: Damage to the offsets column family: key and raw value written into it.
OFFSETS_DAMAGE: dict[str, tuple[bytes, bytes]] = {
    "offset-4-bytes": (_TPK, b"\x00\x00\x00\x05"),
    "offset-12-bytes": (_TPK, bytes(4) + _offset(5)),
    "offset-empty": (_TPK, b""),
    "offset-beyond-end": (_TPK, _offset(10**12)),
    "offset-max": (_TPK, _offset(2**63 - 1)),
    "offset-minus-1": (_TPK, _offset(-1)),
    "offset-minus-7": (_TPK, _offset(-7)),
    "offset-min": (_TPK, _offset(-(2**63))),
    "garbage-key": (b"\xff\xfe not a partition", _offset(3)),
    "status-3-bytes": (STATUS_KEY, b"\x00\x00\x01"),
    "status-unknown": (STATUS_KEY, _offset(7)),
}

CASES = _cases()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Model]]:
    """One clean world per (guarantee, offsets) flavour, built once."""
    return build_worlds(tmp_path_factory.mktemp, WORLDS)


def _damage_for(case: Case) -> Any:
    if case.file != "offsets-cf":
        return None
    key, value = OFFSETS_DAMAGE[case.damage]
    return lambda path: _put_offsets(path, key, value)


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest,
    worlds: dict[str, tuple[Path, Model]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Outcome, Path]]:
    """Run the child of every selected case, a few at a time; case id -> (outcome, damaged file)."""
    wanted = {
        item.callspec.params["case"].id
        for item in request.session.items
        if hasattr(item, "callspec") and "case" in item.callspec.params and item.module is request.module
    }
    with traversable_tmpdir() as base:
        prepared: dict[str, tuple[dict[str, Any], Path]] = {}
        for case in CASES:
            if case.id in wanted:
                prepared[case.id] = prepare(case, worlds[case.world][0], base / case.id, _damage_for(case))
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = {cid: pool.submit(run_child, spec) for cid, (spec, _) in prepared.items()}
            out = {cid: (f.result(), prepared[cid][1]) for cid, f in futures.items()}
        # The damaged files are gone with the directory; the checks need only their paths.
        return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_damaged_file(
    case: Case, outcomes: dict[str, tuple[Outcome, Path]], worlds: dict[str, tuple[Path, Model]]
) -> None:
    outcome, target = outcomes[case.id]
    check(case, outcome, worlds[case.world][1], target)


def test_case_count() -> None:
    """The matrix is as large as the doc says (update docs/reliability.md with it)."""
    assert len({c.id for c in CASES}) == len(CASES)
    print(f"{len(CASES)} bad-input cases")


# -- the statestore command on damaged files ----------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


CLI_DAMAGE = [
    "CURRENT-zero-filled",
    "SST-truncated",
    "SST-random-bytes",
    "offset-4-bytes",
    "segment-random-bytes",
    "segment-deleted-dir",
]
#: Damage inspect shows (it opens stores, reads offsets and checks every block's checksum, not the log's batches).
INSPECT_SHOWS = {"CURRENT-zero-filled", "SST-truncated", "SST-random-bytes", "offset-4-bytes"}


@pytest.fixture
def cli_world(worlds: dict[str, tuple[Path, Model]], tmp_path: Path) -> Iterator[Path]:
    import shutil

    root = tmp_path / "w"
    shutil.copytree(worlds["eos-store"][0], root)
    yield root


@pytest.mark.parametrize("damage", CLI_DAMAGE)
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_cli_on_damaged_files(cli_world: Path, command: str, damage: str) -> None:
    """inspect and verify end with one line naming the damaged file and exit 1 -- never a trace."""
    from support.badinput_cases import FILES, random_bytes, truncate, zero_fill

    root = cli_world
    named: Path
    if damage == "CURRENT-zero-filled":
        zero_fill(FILES["CURRENT"](root))
        named = store_dir(root)
    elif damage == "SST-truncated":
        truncate(FILES["SST"](root))
        named = store_dir(root)
    elif damage == "SST-random-bytes":
        named = FILES["SST"](root)  # found when verify reads the data: the message names the SST file
        random_bytes(named)
    elif damage == "offset-4-bytes":
        _put_offsets(store_dir(root), _TPK, b"\x00\x00\x00\x05")
        named = store_dir(root)
    elif damage == "segment-random-bytes":
        named = FILES["segment-first"](root)
        random_bytes(named)
    else:
        import shutil

        named = root / "log" / str(TP)
        shutil.rmtree(named)
    proc = _cli(
        command, "--state-dir", str(root / "state"), "--app-id", "app", "--log-dir", str(root / "log")
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    text = "".join((proc.stdout + proc.stderr).split())  # the table wraps long paths anywhere
    if command == "inspect":
        # inspect shows what it finds: a damaged store's row names it and the problem (exit 0).
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
        if damage in INSPECT_SHOWS:
            assert "".join(str(named).split()) in text, text
        return
    assert proc.returncode == 1, f"{command} did not notice {damage}: {proc.stdout} {proc.stderr}"
    # A deleted partition directory is an empty partition: the error names the partition and its end.
    want = str(TP) if damage == "segment-deleted-dir" else str(named)
    assert want in text, text


@pytest.mark.parametrize("damage", ["zero-filled", "random-bytes", "wrong-version", "absurd-length"])
def test_cli_log_dump_on_damaged_segment(cli_world: Path, damage: str) -> None:
    """``statestore log dump`` of a damaged last segment: exit 1, one line naming the segment, no trace."""
    from support.badinput_cases import FILES, GENERIC, SPECIFIC

    segment = FILES["segment-last"](cli_world)
    SPECIFIC.get(("segment-last", damage), GENERIC.get(damage))(segment)  # type: ignore[misc]
    proc = _cli("log", "dump", str(cli_world / "log"), "--partition", str(TP))
    assert "Traceback" not in proc.stderr, proc.stderr
    if damage == "random-bytes":
        # A batch whose CRC does not match is shown, as kafka-dump-log shows it: crcValid false.
        assert proc.returncode == 0, (proc.returncode, proc.stderr)
        rows = [line for line in proc.stdout.splitlines() if segment.name in line]
        assert any("false" in line.split("│")[-2] for line in rows), proc.stdout
        return
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr)
    assert str(segment) in "".join(proc.stderr.split()), proc.stderr
