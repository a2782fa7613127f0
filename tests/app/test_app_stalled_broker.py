"""Exactly-once through a broker that stalls (SIGSTOP) as the application commits.

A broker of its own (the session's is not disturbed) is stopped, for longer than the application's
request timeout, by the counting application itself (``counting_app.py``, one instance, a commit
every 100 ms, a steady input) just as it asks for its 20th transaction commit, and resumed after.
The commit times out and stays running inside librdkafka, which refuses every other transactional
call until the same one is asked again: an application that answered with an abort and the next
``begin`` was refused forever while it kept polling (alive, doing nothing). Now the commit is asked
again for one more request timeout (a short stall: it completes), and after that it is in doubt:
the same producer's commit is asked again until the broker answers (``task_timeout``; no second
client of the transactional id is made while the first still retries), and every task starts
again from what the changelog and the group coordinator hold. Either way the output topic,
read ``read_committed``, must hold for every key exactly the counts 1, 2, 3, ... with their running
sums: nothing lost, nothing repeated.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from app_tools import (
    create_topics,
    expected_outputs,
    first_difference,
    input_records,
    output_by_key,
    produce,
    read_committed,
    start_counting_app,
    unique,
)
from counting_app import STALL_ENV

from support.kafka_broker import Broker

PARTITIONS = 4
#: The application's request timeout: each transactional call gives up after it, and is asked
#: again for as long once more.
REQUEST_TIMEOUT = 3.0


@pytest.mark.parametrize(
    "stall",
    [
        pytest.param(1.5 * REQUEST_TIMEOUT, id="within-the-retry"),
        pytest.param(3 * REQUEST_TIMEOUT, id="past-the-retry"),
        # In `make torture` only (18 s of a stalled broker, past the 10 s transaction timeout;
        # docs/app.md). About 1 run in 8 the broker, waking, aborted the expired transaction while
        # it handled the client's queued commit of it (an IllegalStateException in Kafka 4.4's
        # coordinator), which left the transaction's offset commit pending: the group's committed
        # offsets unreadable for minutes. The instance now clears it (docs/app.md).
        pytest.param(6 * REQUEST_TIMEOUT, id="past-the-new-producer's-retry", marks=pytest.mark.torture),
    ],
)
def test_a_broker_stalled_during_commits_loses_and_repeats_nothing(
    own_broker: Broker, tmp_path: Path, stall: float
) -> None:
    broker = own_broker
    app_id, inp, out = unique("stall-app"), unique("stall-in"), unique("stall-out")
    create_topics(broker.bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    records = input_records(seed=99, records=6000, keys=40, partitions=PARTITIONS)
    want = expected_outputs(records)
    log = tmp_path / "instance.log"
    proc = start_counting_app(
        broker.bootstrap,
        app_id,
        tmp_path / "state",
        inp,
        out,
        log,
        "exactly_once_v2",
        commit_interval_ms=100,
        request_timeout=REQUEST_TIMEOUT,
        session_timeout_ms=45_000,
        env={STALL_ENV: f"{broker.pid}:20:{stall}"},
    )

    got, codes = _feed_until_counted(broker, inp, out, records, want, [(proc, log)])
    code = codes[0]
    text = log.read_text()
    for key, outputs in want.items():
        assert got.get(key) == outputs, (
            f"key {key!r}: {first_difference(got.get(key, []), outputs)}\n{text[-3000:]}"
        )
    assert code == 0, text[-3000:]
    # The build before was refused every transactional call after the timed-out commit.
    assert "Conflicting" not in text, text[-3000:]
    if stall > 2 * REQUEST_TIMEOUT:
        # Past the retry the commit is in doubt, as on an idle machine, and the same producer's commit
        # is asked again until the broker wakes: it completes, or (the coordinator having ended the
        # transaction otherwise) fails for good and only then is the producer replaced. Under the
        # full suite's load the client was once seen to hold the commit until the broker woke and
        # complete it, and the 20th commit to get through just before the broker stopped, the next
        # transaction's calls failing, its abort too, and the dead producer replaced (counts exact).
        in_doubt = "the commit is in doubt" in text
        replaced = "the producer is dead; replacing it" in text
        assert in_doubt or replaced or "commit failed" not in text, text[-3000:]
        if in_doubt:
            ended = [text.find(s) for s in ("the commit in doubt completed", "could not be settled")]
            assert max(ended) >= 0, text[-3000:]
            # no second client of the id while the first still retried: none made before it settled
            renewed = text.find("replacing the producer failed")
            assert renewed < 0 or renewed > min(i for i in ended if i >= 0), text[-3000:]
    else:
        assert "commit failed" not in text and "in doubt" not in text, text[-3000:]  # it completed


def _feed_until_counted(
    broker: Broker,
    inp: str,
    out: str,
    records: list[tuple[int, bytes, bytes]],
    want: dict[bytes, list[bytes]],
    instances: list[tuple[subprocess.Popen[bytes], Path]],
) -> tuple[dict[bytes, list[bytes]], list[int]]:
    """Feed ``records`` (~20 s of input; a stall holds it up too) while the instances count, wait
    for the first stall and for every key's last count, then stop the instances (SIGTERM).
    Returns the output by key and the instances' exit codes; an instance that exits early fails."""
    first_log = instances[0][1]

    def feed() -> None:
        for i in range(0, len(records), 100):
            produce(broker.bootstrap, inp, records[i : i + 100])
            time.sleep(0.33)

    def alive() -> None:
        for proc, log in instances:
            assert proc.poll() is None, (
                f"an instance exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )

    feeder = threading.Thread(target=feed)
    feeder.start()
    got: dict[bytes, list[bytes]] = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "stalling the broker" not in first_log.read_text():
            alive()
            time.sleep(0.2)
        assert "stalling the broker" in first_log.read_text(), first_log.read_text()[-3000:]
        feeder.join()
        final = {k: v[-1] for k, v in want.items()}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = output_by_key(read_committed(broker.bootstrap, out, PARTITIONS, timeout=30, idle=1.0))
            if all(got.get(k, [b""])[-1] == v for k, v in final.items()):
                break
            alive()
            time.sleep(2)
    finally:
        feeder.join()
        for proc, _ in instances:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc, _ in instances]
    return got, codes


def test_standbys_ride_out_a_stalled_broker_and_the_instances_go_on(
    own_broker: Broker, tmp_path: Path
) -> None:
    """Two instances, a standby of every task: standby updates ask the broker for the changelogs'
    ends every 0.25 s. A stall of 1.5x the request timeout leaves those unanswered: the instances
    hold back their standbys and go on (``task_timeout``); the build before exited with "cannot
    read its offsets". Every count exactly once, both instances alive to the end."""
    broker = own_broker
    app_id, inp, out = unique("stall-standby"), unique("stall-in"), unique("stall-out")
    create_topics(broker.bootstrap, {inp: PARTITIONS, out: PARTITIONS})
    records = input_records(seed=7, records=6000, keys=40, partitions=PARTITIONS)
    want = expected_outputs(records)
    instances = []
    # a stops the broker at its 30th commit; b commits every 5 s, so the stall meets its standby
    # updates rather than a commit of its own.
    stalling = {STALL_ENV: f"{broker.pid}:30:{3 * REQUEST_TIMEOUT}"}
    for name, env, interval in (("a", stalling, 100), ("b", None, 5000)):
        log = tmp_path / f"instance-{name}.log"
        proc = start_counting_app(
            broker.bootstrap,
            app_id,
            tmp_path / f"state-{name}",
            inp,
            out,
            log,
            "exactly_once_v2",
            commit_interval_ms=interval,
            standbys=1,
            request_timeout=REQUEST_TIMEOUT,
            session_timeout_ms=45_000,
            env=env,
        )
        instances.append((proc, log))
        time.sleep(3)  # a first assignment before the second joins
    got, codes = _feed_until_counted(broker, inp, out, records, want, instances)
    texts = [log.read_text() for _, log in instances]
    for key, outputs in want.items():
        assert got.get(key) == outputs, f"key {key!r}: {first_difference(got.get(key, []), outputs)}"
    assert codes == [0, 0], [t[-3000:] for t in texts]
    assert any("a changelog gives no answer" in t for t in texts), "the stall met no standby update"
