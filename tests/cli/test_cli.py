"""The statestore command, driven as a user would: in a subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from statestore import TopicPartition
from statestore._native import _testing
from statestore.changelog.segment_log import SegmentLog
from statestore.cli.common import BarListener, restore_progress
from statestore.restore.engine import restore_store
from statestore.restore.topic_ids import topic_id_path
from support.tasks import produce

APP = "shop"
STORE = "counts"
TOPIC = f"{APP}-{STORE}-changelog"


def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}  # no wrapping of rich output in assertions
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    "command",
    [[], ["demo"], ["restore"], ["inspect"], ["verify"], ["clean"], ["log"], ["log", "dump"]],
    ids=lambda c: " ".join(c) or "main",
)
def test_help_of_every_command(command: list[str]) -> None:
    out = run(*command, "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout
    if command and command != ["log"]:
        assert "Example" in out.stdout, f"{command} --help should show an example"


@pytest.fixture
def app(tmp_path: Path) -> tuple[Path, Path]:
    """Two partitions of changelog (with an aborted transaction), restored into two task directories."""
    log_dir, state_dir = tmp_path / "log", tmp_path / "state"
    log = SegmentLog(log_dir)
    p = log.producer("writer")
    for part in (0, 1):
        p.begin()
        for i in range(200):
            p.send(TOPIC, part, b"k%03d" % (i % 50), b"v%d" % i)
        p.commit()
        p.begin()
        p.send(TOPIC, part, b"k000", b"ABORTED")
        p.abort()
        p.begin()
        p.send(TOPIC, part, b"k001", None)  # tombstone
        p.commit()
    p.close()
    for part in (0, 1):
        store_dir = state_dir / APP / f"0_{part}" / "rocksdb" / STORE
        store_dir.parent.mkdir(parents=True)
        restore_store(store_dir, log, TopicPartition(TOPIC, part))
    log.close()
    return state_dir, log_dir


def test_inspect_json_shows_offsets_and_lag(app: tuple[Path, Path]) -> None:
    state_dir, log_dir = app
    out = run("inspect", "--state-dir", str(state_dir), "--app-id", APP, "--log-dir", str(log_dir), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = {r["task_id"]: r for r in doc["stores"]}
    assert set(rows) == {"0_0", "0_1"}
    for r in rows.values():
        # 200 records + commit marker (201), aborted record + marker (203), tombstone at 203, marker 204
        assert r["store_offset"] == 203
        assert r["log_end"] == 205
        assert r["lag"] == 0  # every committed record is applied
        assert r["offset_lag"] == 1  # only the last commit marker lies beyond the last applied record
        assert r["store"] == STORE and r["changelog"] == f"{TOPIC}-{r['task_id'][-1]}"
        assert r["size_bytes"] > 0 and r["lock_holder_pid"] is None
    table = run("inspect", "--state-dir", str(state_dir), "--app-id", APP)
    assert table.returncode == 0 and "0_1" in table.stdout and "counts" in table.stdout


def test_verify_passes_then_catches_a_tampered_store(app: tuple[Path, Path]) -> None:
    state_dir, log_dir = app
    args = ["verify", "--state-dir", str(state_dir), "--app-id", APP, "--log-dir", str(log_dir)]
    ok = run(*args)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("exact") == 2
    # tamper: change one value behind the changelog's back, keep the offset
    victim = state_dir / APP / "0_1" / "rocksdb" / STORE
    _testing.store_write_batch(victim, [(b"k010", b"tampered")], {f"{TOPIC}-1": 203})
    bad = run(*args)
    assert bad.returncode == 1
    assert "MISMATCH" in bad.stdout
    assert "k010" in bad.stderr and "tampered" in bad.stderr and "0_1" in bad.stderr


def test_verify_catches_a_store_that_lost_a_key(app: tuple[Path, Path]) -> None:
    state_dir, log_dir = app
    victim = state_dir / APP / "0_0" / "rocksdb" / STORE
    _testing.store_write_batch(victim, [(b"k020", None)], {f"{TOPIC}-0": 203})
    bad = run("verify", "--state-dir", str(state_dir), "--app-id", APP, "--log-dir", str(log_dir))
    assert bad.returncode == 1
    assert "k020" in bad.stderr and "(missing)" in bad.stderr


def test_missing_state_dir_is_one_clear_line(tmp_path: Path) -> None:
    out = run("inspect", "--state-dir", str(tmp_path / "nowhere"), "--app-id", APP)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0] and lines[0].startswith("error:")


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    assert run("inspect", "--app-id", APP).returncode == 2  # --state-dir missing
    assert (
        run(
            "verify", "--state-dir", str(tmp_path), "--app-id", APP, "--log-dir", str(tmp_path / "no")
        ).returncode
        == 2
    )
    assert run("frobnicate").returncode == 2


def test_corrupt_log_is_one_clear_line(app: tuple[Path, Path]) -> None:
    state_dir, log_dir = app
    seg = next((log_dir / f"{TOPIC}-0").glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF  # inside the first batch's records: CRC mismatch
    seg.write_bytes(bytes(data))
    out = run("verify", "--state-dir", str(state_dir), "--app-id", APP, "--log-dir", str(log_dir))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(seg) in lines[0] or seg.name in lines[0]


def test_clean_removes_unlocked_old_tasks_and_all(app: tuple[Path, Path]) -> None:
    state_dir, _ = app
    base = ["clean", "--state-dir", str(state_dir), "--app-id", APP]
    out = run(*base, "--cleanup-delay-ms", "0")
    assert out.returncode == 0, out.stderr
    assert "removed 2 task directories" in out.stdout
    (state_dir / APP / "0_5").mkdir()
    refused = run(*base, "--all", input="n\n")
    assert refused.returncode == 1 and (state_dir / APP / "0_5").exists()
    out = run(*base, "--all", "--yes")
    assert out.returncode == 0, out.stderr
    assert not (state_dir / APP).exists()


def test_clean_topic_ids_forgets_only_the_ids_the_stores_were_read_under(app: tuple[Path, Path]) -> None:
    state_dir, _ = app
    task = state_dir / APP / "0_0"
    stores = sorted(p for p in (task / "rocksdb").iterdir() if p.is_dir())
    assert stores, "the fixture restores a store into each task"
    files = [topic_id_path(s) for s in stores] + [topic_id_path(task / "1_0-shaped" / "rocksdb" / STORE)]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{TOPIC} 0 {uuid.uuid4()}\n")
    root = state_dir / APP

    def in_tasks() -> set[Path]:  # the process lock's own files beside the tasks are not looked at
        return {p for p in root.rglob("*") if p.parent != root or p.is_dir()}

    before = in_tasks() - set(files)
    base = ["clean", "--state-dir", str(state_dir), "--app-id", APP]
    assert run(*base, "--topic-ids", "--all").returncode == 2  # one or the other
    out = run(*base, "--topic-ids")
    assert out.returncode == 0, out.stderr
    assert f"forgot the topic ids of {len(files)} stores" in out.stdout
    assert not any(f.exists() for f in files)
    assert in_tasks() == before  # stores and tasks untouched


def test_clean_and_restore_refuse_while_kafka_streams_holds_the_state_directory(
    app: tuple[Path, Path],
) -> None:
    """Kafka Streams locks ``<app>/.lock`` with Java's ``FileChannel.lock`` (a POSIX lock, unseen by
    flock) and keeps its task locks in memory: nothing else on disk says it runs. A child holding
    such a lock stands in for it."""
    state_dir, log_dir = app
    lock = state_dir / APP / ".lock"
    lock.touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(120)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = sorted(p for p in (state_dir / APP).rglob("*"))
        base = ["--state-dir", str(state_dir), "--app-id", APP]
        for args in (
            ["clean", *base, "--cleanup-delay-ms", "0"],
            ["clean", *base, "--all", "--yes"],
            ["clean", *base, "--topic-ids"],
            ["restore", "--log-dir", str(log_dir), *base],
        ):
            out = run(*args)
            said = " ".join((out.stderr + out.stdout).split())  # rich wraps long lines
            assert out.returncode != 0 and f"process {holder.pid}, which holds a POSIX lock" in said, args
        assert sorted(p for p in (state_dir / APP).rglob("*")) == before
    finally:
        holder.kill()
        holder.wait()
    assert run("clean", "--state-dir", str(state_dir), "--app-id", APP, "--all", "--yes").returncode == 0


def test_demo_small_runs_end_to_end(tmp_path: Path) -> None:
    out = run(
        "demo",
        "--records",
        "20000",
        "--partitions",
        "3",
        "--counter-records",
        "6000",
        "--dir",
        str(tmp_path / "demo"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 of 3 stores equal the committed changelog exactly" in out.stdout
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "killed with SIGKILL after committing input position 3,000" in text  # commits every 1,000
    assert "a commit boundary (commits every 1,000)" in text
    assert "counted once each): exact" in text
    assert str(tmp_path / "demo") in out.stdout
    assert (tmp_path / "demo" / "state" / "demo-app" / "0_2" / "rocksdb" / "profiles").is_dir()
    # what the demo tells the user to run next works
    again = run(
        "verify",
        "--state-dir",
        str(tmp_path / "demo" / "state"),
        "--app-id",
        "demo-app",
        "--log-dir",
        str(tmp_path / "demo" / "log"),
    )
    assert again.returncode == 0, again.stderr


def test_restore_in_process_shows_a_bar_per_store_and_a_table(app: tuple[Path, Path], tmp_path: Path) -> None:
    _, log_dir = app
    out = run(
        "restore",
        "--log-dir",
        str(log_dir),
        "--state-dir",
        str(tmp_path / "fresh"),
        "--app-id",
        APP,
        "--threads",
        "2",
    )
    assert out.returncode == 0, out.stderr
    for part in (0, 1):
        assert f"task 0_{part} {STORE}" in out.stdout  # its progress bar
    assert "2 ok, 0 failed" in out.stdout


def test_a_kafka_property_without_a_value_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    out = run(
        "restore",
        "--kafka",
        "127.0.0.1:1",
        "--kafka-config",
        "security.protocol",
        "--state-dir",
        str(tmp_path / "state"),
        "--app-id",
        "app",
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--kafka-config" in out.stderr and "expected KEY=VALUE, got 'security.protocol'" in out.stderr


@pytest.mark.parametrize("mode", ["replay", "bulk"])
def test_a_restore_s_bar_says_the_store_is_being_written_once_the_whole_log_is_read(
    tmp_path: Path, mode: str
) -> None:
    tp = TopicPartition("app-s-changelog", 0)
    log = SegmentLog(tmp_path / "log", sync=False)
    produce(log, tp, [(b"k%d" % i, b"v%d" % i) for i in range(1000)], transactional_id="w")
    assert log.end_offset(tp) == 1001  # the commit marker is the last offset
    progress = restore_progress(Console(file=io.StringIO()))
    bar = BarListener(progress, "task 0_0 s")
    seen: list[tuple[str, str, float]] = []

    def note(kind: str) -> None:
        task = progress.tasks[bar.task]
        seen.append((kind, task.description, task.completed))

    class Watch:
        def on_restore_start(self, tp: TopicPartition, store: str, start: int, end: int) -> None:
            bar.on_restore_start(tp, store, start, end)
            note("start")

        def on_batch_restored(self, tp: TopicPartition, store: str, end: int, n: int) -> None:
            bar.on_batch_restored(tp, store, end, n)
            note("batch")

        def on_restore_end(self, tp: TopicPartition, store: str, total: int) -> None:
            bar.on_restore_end(tp, store, total)
            note("end")

    restore_store(tmp_path / "s", log, tp, mode=mode, listener=Watch(), progress_interval=3600)
    assert seen == [
        ("start", "task 0_0 s", 0),
        ("batch", "task 0_0 s (writing the store)", 1001),
        ("end", "task 0_0 s", 1001),
    ]
