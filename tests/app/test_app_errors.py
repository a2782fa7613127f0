"""Bad input and bad topics: each a clear error from statestore.errors, nothing half-applied.

* the processing function raises on a record: the application stops with
  ``ProcessingError`` naming the task, partition and offset; the open
  transaction is aborted (no output and no store write of it is visible),
  and a restart with a fixed function goes on from the last commit, counting
  every record exactly once;
* input topics with different partition counts, a missing input topic, a
  missing output topic: ``ApplicationError`` at start, naming the topics;
* a store found damaged while processing: the task alone is wiped and
  restored, and processing goes on.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from app_tools import (
    create_topics,
    expected_outputs,
    first_difference,
    input_records,
    open_transactions,
    output_by_key,
    produce,
    read_committed,
    start_counting_app,
    unique,
)
from counting_app import count

from statestore.app import App, Context, Record
from statestore.errors import ApplicationError, ProcessingError, StateStoreError


def app(
    bootstrap: str,
    app_id: str,
    inputs: list[str],
    outputs: list[str],
    state: Path,
    process=count,
    **kw: object,
) -> App:
    return App(
        app_id,
        bootstrap,
        input_topics=inputs,
        output_topics=outputs,
        stores=["agg"],
        process=process,
        state_dir=state,
        **kw,
    )


def run_until(a: App, done, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    a.run(until=lambda: done() or time.monotonic() - t0 > timeout, handle_signals=False)


def test_a_raising_function_stops_the_app_and_aborts_its_transaction(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    app_id, inp, out = unique("bad-app"), unique("bad-in"), unique("bad-out")
    create_topics(kafka_bootstrap, {inp: 2, out: 2})
    good = [(0, b"a", b"1"), (0, b"a", b"2"), (1, b"b", b"5")]
    produce(kafka_bootstrap, inp, good)
    first = app(kafka_bootstrap, app_id, [inp], [out], tmp_path / "state")
    run_until(first, lambda: first.processed >= 3)
    assert first.processed == 3
    # Partition 0 now gets a good record, then one the function raises on: both in one transaction.
    produce(kafka_bootstrap, inp, [(0, b"a", b"3"), (0, b"a", b"boom"), (1, b"b", b"6")])
    second = app(kafka_bootstrap, app_id, [inp], [out], tmp_path / "state", commit_interval_ms=60_000)
    with pytest.raises(ProcessingError) as info:
        run_until(second, lambda: False)
    e = info.value
    assert isinstance(e, StateStoreError)
    assert (str(e.task_id), e.topic, e.partition, e.offset) == ("0_0", inp, 0, 3)
    assert "0_0" in str(e) and f"{inp}-0" in str(e) and "offset 3" in str(e) and "boom" in str(e)
    assert second.aborts >= 1
    # Nothing of the aborted transaction is visible: only the three first outputs, no transaction open.
    outputs = read_committed(kafka_bootstrap, out, 2)
    assert sorted((m.key(), m.value()) for m in outputs) == [(b"a", b"1,1"), (b"a", b"2,3"), (b"b", b"1,5")]
    assert open_transactions(kafka_bootstrap, out, 2) == {}

    # A fixed function goes on from the last commit: the good record after "boom" counted once.
    def skip_boom(record: Record, ctx: Context) -> None:
        if record.value != b"boom":
            count(record, ctx)

    third = app(kafka_bootstrap, app_id, [inp], [out], tmp_path / "state", process=skip_boom)
    run_until(third, lambda: third.processed >= 3)
    outputs = read_committed(kafka_bootstrap, out, 2)
    assert sorted((m.key(), m.value()) for m in outputs) == [
        (b"a", b"1,1"),
        (b"a", b"2,3"),
        (b"a", b"3,6"),
        (b"b", b"1,5"),
        (b"b", b"2,11"),
    ]


def test_input_topics_with_different_partition_counts_are_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    a_in, b_in, out = unique("cp-a"), unique("cp-b"), unique("cp-out")
    create_topics(kafka_bootstrap, {a_in: 4, b_in: 3, out: 4})
    bad = app(kafka_bootstrap, unique("cp-app"), [a_in, b_in], [out], tmp_path / "state")
    with pytest.raises(
        ApplicationError, match=rf"not co-partitioned \({a_in} has 4, {b_in} has 3 partitions\)"
    ):
        bad.start()
    bad.close()


def test_a_missing_input_topic_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    inp, out = unique("gone-in"), unique("gone-out")
    create_topics(kafka_bootstrap, {out: 2})
    bad = app(kafka_bootstrap, unique("gone-app"), [inp], [out], tmp_path / "state")
    with pytest.raises(ApplicationError, match=rf"input topic\(s\) {inp} do not exist") as info:
        bad.start()
    assert info.value.topic == inp


def test_a_missing_output_topic_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    inp, out = unique("no-out-in"), unique("no-out-out")
    create_topics(kafka_bootstrap, {inp: 2})
    bad = app(kafka_bootstrap, unique("no-out-app"), [inp], [out], tmp_path / "state")
    with pytest.raises(ApplicationError, match=rf"output topic\(s\) {out} do not exist") as info:
        bad.start()
    assert info.value.topic == out
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("rocksdb"))


def test_unsupported_store_formats_and_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format 'session' is not a key-value store's"):
        App(
            "x",
            "127.0.0.1:1",
            input_topics=["i"],
            stores={"s": "session"},
            process=count,
            state_dir=tmp_path,
        )
    assert App(
        "x", "127.0.0.1:1", input_topics=["i"], stores={"s": "timestamped"}, process=count, state_dir=tmp_path
    ).stores == {"s": "timestamped"}
    with pytest.raises(ValueError, match="group_protocol"):
        App(
            "x",
            "127.0.0.1:1",
            input_topics=["i"],
            stores=["s"],
            process=count,
            state_dir=tmp_path,
            group_protocol="streams",
        )


def test_a_store_found_corrupted_while_processing_is_wiped_and_restored_and_processing_goes_on(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A damaged block in a task's store (a bad disk sector), found by the first read of a key after a
    restart: the task alone is wiped and restored from its changelog while the other goes on, and
    every count stays exact (exactly-once); the application does not stop with a ``ProcessingError``,
    since neither the function nor the record is at fault."""
    app_id, inp, out = unique("rot-app"), unique("rot-in"), unique("rot-out")
    create_topics(kafka_bootstrap, {inp: 2, out: 2})
    records = input_records(seed=7, records=400, keys=8, partitions=2)
    want = expected_outputs(records)
    state, log = tmp_path / "state", tmp_path / "instance.log"
    produce(kafka_bootstrap, inp, records[:200])
    first = start_counting_app(kafka_bootstrap, app_id, state, inp, out, log)
    try:
        deadline = time.monotonic() + 90
        while len(read_committed(kafka_bootstrap, out, 2, idle=0.5)) < 200 and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, log.read_text()[-3000:]
    [store] = [d for d in state.rglob("agg") if d.parent.parent.name == "0_0"]
    tables = [t for t in store.glob("*.sst") if re.search(rb"k\d\d", t.read_bytes())]
    assert tables, sorted(store.iterdir())
    for table in tables:  # every data block a key of task 0_0 is read from
        with open(table, "r+b") as f:
            head = f.read(8)
            f.seek(0)
            f.write(bytes(b ^ 0xFF for b in head))
    second = start_counting_app(kafka_bootstrap, app_id, state, inp, out, log)
    try:
        produce(kafka_bootstrap, inp, records[200:])
        final = {k: v[-1] for k, v in want.items()}
        deadline = time.monotonic() + 120
        got: dict[bytes, list[bytes]] = {}
        while time.monotonic() < deadline:
            got = output_by_key(read_committed(kafka_bootstrap, out, 2, idle=1.0))
            if all(got.get(k, [b""])[-1] == v for k, v in final.items()):
                break
            assert second.poll() is None, f"exited with {second.returncode}:\n{log.read_text()[-3000:]}"
            time.sleep(1)
    finally:
        second.send_signal(signal.SIGTERM)
        code = second.wait(timeout=60)
    text = log.read_text()
    for key, outputs in want.items():
        assert got.get(key) == outputs, f"key {key!r}: {first_difference(got.get(key, []), outputs)}"
    assert code == 0, text[-3000:]
    assert "the local state of task(s) 0_0 is corrupted" in text and "Corruption" in text, text[-3000:]
    assert "task(s) 0_1" not in text
