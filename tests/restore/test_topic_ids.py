"""The topic id kept beside a store (``statestore.restore.topic_ids``), without a broker.

Against a broker, ``tests/changelog/kafka/test_kafka.py::test_a_recreated_topic_is_task_corrupted_never_read_on``
shows what it is for: a restarted process is held to the id its store was read under.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition, _native, restore_store
from statestore.errors import RestoreError
from statestore.restore import topic_ids

TP = TopicPartition("app-s-changelog", 3)
#: Fixed: test ids must be the same in every xdist worker.
ANY_ID = "5f0c2a8e-3b1d-4c7a-9e2f-0a1b2c3d4e5f"


def _client() -> _native.KafkaClient:
    # Never connects: only its type matters here.
    return _native.KafkaClient({"bootstrap.servers": "127.0.0.1:1"}, 0.3, 0.3)


def test_the_id_lies_beside_the_store_where_kafka_streams_never_looks_inside_one() -> None:
    assert topic_ids.topic_id_path(Path("/t/0_3/rocksdb/s")) == Path("/t/0_3/rocksdb/.s.topic-id")
    assert topic_ids.topic_id_path(Path("/t/0_3/w")) == Path("/t/0_3/.w.topic-id")


def test_a_recorded_id_is_what_the_next_restore_is_held_to_and_a_new_one_is_written_once(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    store.mkdir()
    client = _client()
    was = str(uuid.uuid4())
    topic_ids.topic_id_path(store).write_text(f"{TP.topic} {TP.partition} {was}\n")
    assert topic_ids.held_topic_id(client, TP, store) == was
    topic_ids.record(store, TP, was, was)  # read under the id it was held to: the file stays as it is
    topic_ids.record(store, TP, was, None)  # nothing read under an id
    assert topic_ids.recorded_topic_id(store, TP) == was
    now = str(uuid.uuid4())
    topic_ids.record(store, TP, was, now)  # restored from scratch under the new topic's id
    assert topic_ids.topic_id_path(store).read_text() == f"{TP.topic} {TP.partition} {now}\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_record_beside_a_store_that_is_gone_no_longer_stands(tmp_path: Path) -> None:
    store = tmp_path / "s"
    topic_ids.topic_id_path(store).write_text(f"{TP.topic} {TP.partition} {ANY_ID}\n")
    # The store was removed by hand (or by a tool) and the file left: the restore from scratch
    # must not be held to the old id, nor leave it for the next one to be held to.
    assert topic_ids.held_topic_id(_client(), TP, store) is None
    assert not topic_ids.topic_id_path(store).exists()
    topic_ids.record(store, TP, None, ANY_ID)  # a failed restore that created nothing: nothing written
    assert not topic_ids.topic_id_path(store).exists()
    store.mkdir()
    topic_ids.record(store, TP, None, ANY_ID)
    assert topic_ids.recorded_topic_id(store, TP) == ANY_ID


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
    with caplog.at_level(logging.WARNING, logger="statestore.restore.topic_ids"):
        assert topic_ids.held_topic_id(_client(), TP, store) is None
    assert str(path) in caplog.text and "as it finds it" in caplog.text
    topic_ids.record(store, TP, None, ANY_ID)  # written anew after the restore
    assert topic_ids.recorded_topic_id(store, TP) == ANY_ID


def test_a_changelog_not_read_through_the_native_client_holds_nothing(tmp_path: Path) -> None:
    store = tmp_path / "s"
    store.mkdir()
    topic_ids.topic_id_path(store).write_text(f"{TP.topic} {TP.partition} {ANY_ID}\n")
    assert topic_ids.is_native(_client())
    assert not topic_ids.is_native(SegmentLog(tmp_path / "log"))
    assert topic_ids.held_topic_id(SegmentLog(tmp_path / "log"), TP, store) is None
    assert topic_ids.held_topic_id(tmp_path / "log", TP, store) is None


def test_a_bad_topic_id_given_to_a_restore_names_it(tmp_path: Path) -> None:
    seg = SegmentLog(tmp_path / "log", sync=False)
    with pytest.raises(RestoreError, match="not-a-uuid"):
        restore_store(tmp_path / "s", seg, TP, topic_id="not-a-uuid")


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
