"""Health, per-task state and a clean SIGTERM, against a real broker and real processes.

Two instances of ``counting_app.py`` over 4 partitions with one standby
replica each. While both run, ``statestore inspect`` on an instance's state
directory (another process, reading only) names each task's state --
``RUNNING`` for the tasks it owns, ``STANDBY`` for the ones it keeps up to
date -- and the instance's liveness (its state and how long ago its loop
polled). Then SIGTERM closes the instance cleanly: it exits 0, every store
on disk is ``closed``, its snapshot is gone, and it left the group at once
(the survivor is alone in the group before the 6 s session timeout could
have expired). The survivor takes its tasks from its standbys, which its
published metrics count as standby hits; after more input and a SIGTERM of
the survivor the output holds every count exactly once.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from app_tools import create_topics, open_transactions, produce, read_committed, start_counting_app, unique
from confluent_kafka.admin import AdminClient
from test_app_exactly_once import expected_outputs, first_difference, output_by_key

PARTITIONS = 4
KEYS = 20


def inspect_json(state_dir: Path, app_id: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statestore.cli",
            "inspect",
            "--state-dir",
            str(state_dir),
            "--app-id",
            app_id,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def inspect_table(state_dir: Path, app_id: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statestore.cli",
            "inspect",
            "--state-dir",
            str(state_dir),
            "--app-id",
            app_id,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def group_members(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.describe_consumer_groups([group])[group].result(10).members)


def wait_for(what: str, cond, timeout: float, procs: list, logs: list[Path]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        for i, p in enumerate(procs):
            assert p.poll() is None, (
                f"instance {i} exited with {p.returncode}:\n{logs[i].read_text()[-3000:]}"
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + "\n".join(
            log.read_text()[-2000:] for log in logs
        )
        time.sleep(0.3)


def test_inspect_names_task_states_and_sigterm_closes_clean(kafka_bootstrap: str, tmp_path: Path) -> None:
    app_id, inp, out = unique("health-app"), unique("health-in"), unique("health-out")
    create_topics(kafka_bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    rng = random.Random(7)
    records = [
        (k % PARTITIONS, b"k%02d" % k, b"%d" % rng.randrange(100))
        for k in (rng.randrange(KEYS) for _ in range(2000))
    ]
    want = expected_outputs(records)
    logs = [tmp_path / f"instance-{i}.log" for i in range(2)]
    states = [tmp_path / f"state-{i}" for i in range(2)]
    procs = [
        start_counting_app(kafka_bootstrap, app_id, states[i], inp, out, logs[i], standbys=1)
        for i in range(2)
    ]
    try:
        produce(kafka_bootstrap, inp, records[:1000])
        wait_for(
            "both instances running their tasks and holding standbys",
            lambda: (
                all("standby tasks now 0_" in log.read_text() for log in logs)
                and len(read_committed(kafka_bootstrap, out, PARTITIONS, idle=0.5)) >= 1000
            ),
            90,
            procs,
            logs,
        )

        # -- inspect names each task's state, and the instance's liveness -------------------------
        def states_of(i: int) -> dict[str, str]:
            doc = inspect_json(states[i], app_id)
            return doc["processes"][0]["task_states"] if doc["processes"] else {}

        wait_for(
            "instance 0 to publish 2 RUNNING and 2 STANDBY tasks",
            lambda: sorted(states_of(0).values()) == ["RUNNING", "RUNNING", "STANDBY", "STANDBY"],
            30,
            procs,
            logs,
        )
        doc = inspect_json(states[0], app_id)
        (proc,) = doc["processes"]
        assert proc["pid"] == procs[0].pid
        assert proc["liveness"]["state"] == "RUNNING"
        assert time.time() - proc["liveness"]["last_poll_at"] < 10
        task_states = proc["task_states"]
        assert sorted(task_states) == [f"0_{p}" for p in range(PARTITIONS)]
        assert {s["task_id"] for s in doc["stores"]} == set(task_states)
        table = inspect_table(states[0], app_id)
        print(table)
        for task, state in task_states.items():
            assert re.search(rf"{task}\s.*{state} \(pid {procs[0].pid}\)", table), (task, state, table)
        assert f"live: pid {procs[0].pid}; RUNNING; last poll" in table

        # -- SIGTERM: a clean close, stores CLOSED, the group left at once -----------------------
        procs[0].send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert procs[0].wait(timeout=60) == 0, logs[0].read_text()[-3000:]
        closed_after = time.monotonic() - t0
        deadline = time.monotonic() + 4  # well inside the 6 s session timeout
        while group_members(kafka_bootstrap, app_id) != 1:
            assert time.monotonic() < deadline, "the closed instance did not leave the group"
            time.sleep(0.2)
        left_after = time.monotonic() - t0
        doc = inspect_json(states[0], app_id)
        assert doc["processes"] == [], "the closed instance's snapshot is still there"
        assert doc["process_lock_holder_pid"] is None
        assert doc["stores"] and {s["status"] for s in doc["stores"]} == {"closed"}, doc["stores"]

        # -- the survivor took the tasks from its standbys: its metrics say so --------------------
        def promotions() -> dict[str, int]:
            d = inspect_json(states[1], app_id)
            return d["processes"][0]["standby_promotions"] if d["processes"] else {}

        wait_for(
            "the survivor to run every task",
            lambda: len(states_of(1)) == 4 and set(states_of(1).values()) == {"RUNNING"},
            60,
            procs[1:],
            logs[1:],
        )
        wait_for(
            "the survivor's standby hits", lambda: promotions().get("hit", 0) == 2, 30, procs[1:], logs[1:]
        )
        assert promotions().get("miss", 0) == 0
        produce(kafka_bootstrap, inp, records[1000:])
        final = {k: v[-1] for k, v in want.items()}
        got: dict[bytes, list[bytes]] = {}

        def complete() -> bool:
            nonlocal got
            got = output_by_key(read_committed(kafka_bootstrap, out, PARTITIONS, idle=1.0))
            return all(got.get(k, [b""])[-1] == v for k, v in final.items())

        wait_for("every final count", complete, 90, procs[1:], logs[1:])
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(timeout=60) == 0, logs[1].read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    doc = inspect_json(states[1], app_id)
    assert {s["status"] for s in doc["stores"]} == {"closed"}, doc["stores"]
    bad = {k: first_difference(got.get(k, []), w) for k, w in want.items() if got.get(k) != w}
    assert not bad, bad
    assert open_transactions(kafka_bootstrap, out, PARTITIONS) == {}
    print(f"SIGTERM: exited 0 after {closed_after:.1f} s, group left after {left_after:.1f} s")
