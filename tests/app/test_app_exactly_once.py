"""Exactly-once end to end with a real SIGKILL (and a real stall), after Kafka's ``streams_eos_test``.

Two instances of ``counting_app.py`` (per key a count and a running sum,
store ``agg``) share 4 input partitions through the consumer group. While
the input flows, one instance is SIGKILLed mid-transaction (it commits
every 3 s; the kill comes while one of its output partitions has an open
transaction, and the output topic is checked to hold the killed
transaction's aborted records) and restarted
on its state directory only after the group gave its tasks to the survivor
(session timeout 6 s), which restores them from the changelog and goes on;
the restarted instance gets them back and restores the survivor's writes on
top of its own state. The output topic, read ``read_committed``, must hold
for every key exactly the counts 1, 2, 3, ... with the running sums of the
input's values, no gap and no repeat; and no transaction may be left open
once both instances closed. The ``sigstop`` variant stalls the instance
instead (a zombie that wakes up); the at-least-once variant checks that
nothing is lost.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from app_tools import (
    create_topics,
    expected_outputs,
    first_difference,
    input_records,
    last_count,
    open_transactions,
    output_by_key,
    produce,
    read_committed,
    start_counting_app,
    unique,
)

PARTITIONS = 4
KEYS = 40
RECORDS = 6000
#: Seconds the killed instance stays dead: longer than the session timeout (6 s), so its tasks move.
RESTART_AFTER = 10.0
#: Commit interval of the instances: long enough that a kill lands inside an open transaction.
COMMIT_MS = 3000


def owned(log: Path) -> set[int]:
    """Partitions of the tasks an instance's log says it runs last."""
    found = re.findall(r"active tasks now ([0-9_, ]+)", log.read_text())
    return {int(t.split("_")[1]) for t in found[-1].split(", ")} if found else set()


@pytest.mark.parametrize(
    ("how", "guarantee", "standbys"),
    [
        ("sigkill", "exactly_once_v2", 0),
        ("sigkill", "exactly_once_v2", 1),
        ("sigstop", "exactly_once_v2", 0),
        ("sigkill", "at_least_once", 0),
    ],
)
def test_counts_after_an_instance_dies_or_stalls(
    how: str, guarantee: str, standbys: int, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``sigkill``: the instance dies and is restarted. ``sigstop``: it stalls (a zombie) past the
    session and transaction timeouts and then goes on: its transaction was aborted, its producer is
    fenced and its offset commit refused, so it starts its tasks again from their last commit.

    Exactly-once: every count exact. At-least-once: nothing lost (every key's last count at least
    its number of input records; repeats allowed). With a standby replica, the survivor holds the
    killed instance's tasks as standbys and promotes them."""
    eos = guarantee == "exactly_once_v2"
    app_id, inp, out = unique("eos-app"), unique("eos-in"), unique("eos-out")
    create_topics(kafka_bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    records = input_records(seed=1234, records=RECORDS, keys=KEYS, partitions=PARTITIONS)
    want = expected_outputs(records)
    logs = [tmp_path / f"instance-{i}.log" for i in range(2)]
    states = [tmp_path / f"state-{i}" for i in range(2)]
    procs = [
        start_counting_app(
            kafka_bootstrap,
            app_id,
            states[i],
            inp,
            out,
            logs[i],
            guarantee,
            commit_interval_ms=COMMIT_MS,
            standbys=standbys,
        )
        for i in range(2)
    ]

    def feed() -> None:  # the input flows for ~20 s
        for i in range(0, RECORDS, 100):
            produce(kafka_bootstrap, inp, records[i : i + 100])
            time.sleep(0.33)

    feeder = threading.Thread(target=feed)
    feeder.start()
    kills = 0
    try:
        # Kill instance 0 once output flows (both instances are processing by then), restart it.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (
            "tasks restored; resumed" not in logs[0].read_text()
            or len(read_committed(kafka_bootstrap, out, PARTITIONS, idle=0.5)) < 800
            or (standbys and "standby tasks now 0_" not in logs[1].read_text())
        ):
            time.sleep(0.5)
        for i, p in enumerate(procs):
            assert p.poll() is None, (
                f"instance {i} exited with {p.returncode}:\n{logs[i].read_text()[-3000:]}"
            )
        # Strike inside an open transaction of instance 0 that holds output records: the last stable
        # offset of one of its output partitions is below the partition's end.
        deadline = time.monotonic() + (30 if eos else 0)
        while time.monotonic() < deadline and not set(
            open_transactions(kafka_bootstrap, out, PARTITIONS)
        ) & owned(logs[0]):
            time.sleep(0.02)
        if how == "sigkill":
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait()
            time.sleep(RESTART_AFTER)
            procs[0] = start_counting_app(
                kafka_bootstrap,
                app_id,
                states[0],
                inp,
                out,
                logs[0],
                guarantee,
                commit_interval_ms=COMMIT_MS,
                standbys=standbys,
            )
        else:
            os.kill(procs[0].pid, signal.SIGSTOP)
            time.sleep(RESTART_AFTER + 2)  # past the session (6 s) and transaction (10 s) timeouts
            os.kill(procs[0].pid, signal.SIGCONT)
        kills += 1
        feeder.join()
        # Wait until every key's last output is its final count (or time out and report).
        final = {k: v[-1] for k, v in want.items()}
        deadline = time.monotonic() + 150
        got: dict[bytes, list[bytes]] = {}
        while time.monotonic() < deadline:
            got = output_by_key(read_committed(kafka_bootstrap, out, PARTITIONS, timeout=30, idle=1.0))
            if all(got.get(k, [b""])[-1] == v for k, v in final.items()):
                break
            if not eos and all(last_count(got.get(k, [b"0,0"])) >= len(w) for k, w in want.items()):
                break
            for i, p in enumerate(procs):
                assert p.poll() is None, (
                    f"instance {i} exited with {p.returncode}:\n{logs[i].read_text()[-3000:]}"
                )
            time.sleep(2)
    finally:
        feeder.join()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0, 0], f"clean shutdown failed: {codes}\n" + "\n".join(
        log.read_text()[-3000:] for log in logs
    )

    survivor = logs[1].read_text()
    assert "active tasks now 0_0, 0_1, 0_2, 0_3" in survivor, (
        "the survivor never took the killed instance's tasks"
    )
    if standbys:
        moved = re.findall(r"tasks moved here: ([0-9_, ]+); found a standby: ([0-9_, ]+|none)", survivor)
        assert moved and moved[0][0] == moved[0][1], f"the survivor did not find its standbys: {moved}"
    rebalances = sum(log.read_text().count(": assigned ") for log in logs)
    if not eos:
        short = {
            k: (last_count(got.get(k, [b"0,0"])), len(w))
            for k, w in want.items()
            if last_count(got.get(k, [b"0,0"])) < len(w)
        }
        assert not short, f"at-least-once lost records (last count, inputs): {short}"
        print(
            f"{how} {guarantee}: assignments={rebalances} records={RECORDS} "
            f"outputs={sum(map(len, got.values()))} (repeats allowed)"
        )
        return
    bad = {k: first_difference(got.get(k, []), w) for k, w in want.items() if got.get(k) != w}
    assert not bad, f"{len(bad)} keys differ from the input's counts and sums: " + "; ".join(
        f"{k!r} {d}" for k, d in list(bad.items())[:5]
    )
    assert sum(map(len, got.values())) == RECORDS
    assert open_transactions(kafka_bootstrap, out, PARTITIONS) == {}
    raw = read_committed(kafka_bootstrap, out, PARTITIONS, timeout=30, idle=1.0, isolation="read_uncommitted")
    zombie = logs[0].read_text()
    if how == "sigkill":
        assert len(raw) > RECORDS, "no aborted output: the kill did not land inside a transaction"
    else:  # the stalled instance found out on waking: membership lost, or producer fenced
        assert "(membership expired)" in zombie or "the producer was fenced" in zombie, zombie[-3000:]
    print(
        f"{how} {guarantee} standbys={standbys}: kills={kills} assignments={rebalances} records={RECORDS} output committed={RECORDS} "
        f"output incl. aborted={len(raw)} lost={zombie.count('(membership expired)')} fenced={zombie.count('the producer was fenced')}"
    )
