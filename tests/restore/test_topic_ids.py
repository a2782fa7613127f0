"""The topic id kept beside a store (``statestore.restore.topic_ids``), without a broker.

Against a broker, ``tests/changelog/kafka/test_kafka.py::test_a_recreated_topic_is_task_corrupted_never_read_on``
shows what it is for: a restarted process is held to the id its store was read under.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition, _native
from statestore.restore import topic_ids

TP = TopicPartition("app-s-changelog", 3)
#: Fixed: test ids must be the same in every xdist worker.
ANY_ID = "5f0c2a8e-3b1d-4c7a-9e2f-0a1b2c3d4e5f"


def _client() -> _native.KafkaClient:
    # Never connects: holding and naming ids are the client's own memory.
    return _native.KafkaClient({"bootstrap.servers": "127.0.0.1:1"}, 0.3, 0.3)


def test_the_id_lies_beside_the_store_where_kafka_streams_never_looks_inside_one() -> None:
    assert topic_ids.topic_id_path(Path("/t/0_3/rocksdb/s")) == Path("/t/0_3/rocksdb/.s.topic-id")
    assert topic_ids.topic_id_path(Path("/t/0_3/w")) == Path("/t/0_3/.w.topic-id")


def test_a_recorded_id_holds_the_client_and_a_new_one_is_written_once(tmp_path: Path) -> None:
    store = tmp_path / "s"
    store.mkdir()
    client = _client()
    was = str(uuid.uuid4())
    topic_ids.topic_id_path(store).write_text(f"{TP.topic} {TP.partition} {was}\n")
    held = topic_ids.hold(client, TP, store)
    assert held is not None and held.recorded == was
    assert (
        client.topic_id(TP.topic, TP.partition) == was
    )  # reads going on from the store's offset are held to it
    topic_ids.record(held)  # nothing read under another id: the file stays as it is
    assert topic_ids.recorded_topic_id(store, TP) == was
    now = str(uuid.uuid4())
    client.hold_to(TP.topic, TP.partition, now)  # as a read from scratch of the new topic leaves it
    topic_ids.record(held)
    assert topic_ids.topic_id_path(store).read_text() == f"{TP.topic} {TP.partition} {now}\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_store_with_no_file_takes_the_id_it_is_read_under(tmp_path: Path) -> None:
    store = tmp_path / "s"
    client = _client()
    held = topic_ids.hold(client, TP, store)
    assert held is not None and held.recorded is None
    assert client.topic_id(TP.topic, TP.partition) is None
    topic_ids.record(held)  # no id known (nothing asked of the broker): nothing to write
    assert not topic_ids.topic_id_path(store).exists()
    now = str(uuid.uuid4())
    client.hold_to(TP.topic, TP.partition, now)
    topic_ids.record(held)  # the store does not exist (a failed restore created nothing): nothing written
    assert not topic_ids.topic_id_path(store).exists()
    store.mkdir()
    topic_ids.record(held)
    assert topic_ids.recorded_topic_id(store, TP) == now


@pytest.mark.parametrize(
    "text",
    ["", "garbage", f"other-topic 3 {ANY_ID}", f"{TP.topic} 4 {ANY_ID}", f"{TP.topic} 3 not-a-uuid"],
)
def test_a_file_that_names_no_id_of_the_partition_holds_nothing_and_says_so(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "s"
    store.mkdir()
    path = topic_ids.topic_id_path(store)
    path.write_text(text)
    client = _client()
    with caplog.at_level(logging.WARNING, logger="statestore.restore.topic_ids"):
        held = topic_ids.hold(client, TP, store)
    assert held is not None and held.recorded is None
    assert client.topic_id(TP.topic, TP.partition) is None
    assert str(path) in caplog.text and "as it finds it" in caplog.text
    now = str(uuid.uuid4())
    client.hold_to(TP.topic, TP.partition, now)
    topic_ids.record(held)  # written anew after the restore
    assert topic_ids.recorded_topic_id(store, TP) == now


def test_a_changelog_not_read_through_the_native_client_holds_nothing(tmp_path: Path) -> None:
    assert topic_ids.hold(SegmentLog(tmp_path / "log"), TP, tmp_path / "s") is None
    assert topic_ids.hold(tmp_path / "log", TP, tmp_path / "s") is None
    topic_ids.record(None)


def test_a_staged_store_takes_its_id_with_it_into_place(tmp_path: Path) -> None:
    target, staged = tmp_path / "t" / "s", tmp_path / "staging" / "store"
    target.parent.mkdir()
    staged.parent.mkdir()
    topic_ids.copy(target, staged)  # none to copy
    assert not topic_ids.topic_id_path(staged).exists()
    topic_ids.topic_id_path(target).write_text(f"{TP.topic} 3 {uuid.uuid4()}\n")
    topic_ids.copy(target, staged)
    assert topic_ids.topic_id_path(staged).read_text() == topic_ids.topic_id_path(target).read_text()
    now = f"{TP.topic} 3 {uuid.uuid4()}\n"
    topic_ids.topic_id_path(staged).write_text(now)
    topic_ids.move(staged, target)
    assert topic_ids.topic_id_path(target).read_text() == now
    assert not topic_ids.topic_id_path(staged).exists()
    topic_ids.move(staged, target)  # a staged store with none: the one in place no longer stands
    assert not topic_ids.topic_id_path(target).exists()
