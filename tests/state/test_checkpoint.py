"""The `.checkpoint` file: Kafka's OffsetCheckpointTest scenarios, byte-exact format, bad input."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from statestore import OFFSET_UNKNOWN, CheckpointError, OffsetCheckpoint, TopicPartition

TP = TopicPartition


@pytest.fixture
def ckpt(tmp_path: Path) -> OffsetCheckpoint:
    return OffsetCheckpoint(tmp_path / ".checkpoint")


# -- Kafka's OffsetCheckpointTest, items 1-7 ------------------------------------------------------


def test_read_write_delete_and_rewrite(ckpt: OffsetCheckpoint) -> None:
    offsets = {TP("topic", 0): 0, TP("topic", 1): 1, TP("topic", 2): 2}
    ckpt.write(offsets)
    assert ckpt.read() == offsets
    ckpt.delete()
    assert not ckpt.path.exists()
    offsets[TP("topic", 3)] = 3
    ckpt.write(offsets)
    assert ckpt.read() == offsets


def test_no_file_written_when_no_offsets(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({})
    assert not ckpt.path.exists()
    assert ckpt.read() == {}
    ckpt.delete()  # deleting a missing file is fine


def test_empty_write_deletes_existing_file(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({TP("topic", 0): 5})
    assert ckpt.path.exists()
    ckpt.write({})
    assert not ckpt.path.exists()


def test_invalid_offsets_skipped_on_read_with_warning(
    ckpt: OffsetCheckpoint, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt.path.write_bytes(b"0\n1\ntopic 0 -1\n")
    with caplog.at_level(logging.WARNING, logger="statestore.state.checkpoint"):
        assert ckpt.read() == {}
    assert "skipping invalid offset -1 for topic-0" in caplog.text


def test_skipped_offsets_count_towards_expected_size(ckpt: OffsetCheckpoint) -> None:
    ckpt.path.write_bytes(b"0\n3\ntopic 0 -1\ntopic 1 7\ntopic 2 -3\n")
    assert ckpt.read() == {TP("topic", 1): 7}


def test_sentinel_offset_round_trips(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({TP("topic", 1): OFFSET_UNKNOWN})
    assert ckpt.read() == {TP("topic", 1): -4}
    assert ckpt.path.read_bytes() == b"0\n1\ntopic 1 -4\n"


@pytest.mark.parametrize("bad", [-1, -2, -3, -5, -(2**63)])
def test_write_refuses_negative_offset_naming_the_partition(ckpt: OffsetCheckpoint, bad: int) -> None:
    ckpt.write({TP("topic", 9): 1})
    with pytest.raises(ValueError, match="topic-1"):
        ckpt.write({TP("topic", 0): 5, TP("topic", 1): bad, TP("topic", 2): 7})
    assert ckpt.read() == {TP("topic", 9): 1}, "a refused write must leave the old file untouched"


def test_write_into_missing_directory_names_path_and_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "gone" / "0_1" / ".checkpoint"
    with pytest.raises(CheckpointError, match="No such file or directory") as info:
        OffsetCheckpoint(target).write({TP("topic", 0): 1})
    assert str(target) in str(info.value)
    assert info.value.path == str(target)
    assert not (tmp_path / "gone").exists()


# -- byte-exact compatibility with Kafka Streams ----------------------------------------------------


def test_write_is_byte_exact(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({TP("topic", 1): 123})
    assert ckpt.path.read_bytes() == b"0\n1\ntopic 1 123\n"


def test_kafka_example_files_read_as_expected(ckpt: OffsetCheckpoint) -> None:
    ckpt.path.write_bytes(b"0\n3\ntopic 0 0\ntopic 1 1\ntopic 2 2\n")
    assert ckpt.read() == {TP("topic", 0): 0, TP("topic", 1): 1, TP("topic", 2): 2}
    ckpt.path.write_bytes(b"0\n1\ntopic 1 -4\n")
    assert ckpt.read() == {TP("topic", 1): -4}
    ckpt.path.write_bytes(b"0\n1\ntest-application-My-Topology-persistentStore-changelog 1 123\n")
    assert ckpt.read() == {TP("test-application-My-Topology-persistentStore-changelog", 1): 123}


def test_entries_in_any_order_and_windows_line_ends(ckpt: OffsetCheckpoint) -> None:
    ckpt.path.write_bytes(b"0\r\n2\r\nb 1 10\r\na 0 20\r\n")
    assert ckpt.read() == {TP("b", 1): 10, TP("a", 0): 20}


def test_topics_with_dashes_and_dots(ckpt: OffsetCheckpoint) -> None:
    offsets = {TP("my.app-store-changelog", 12): 2**63 - 1, TP("x", 0): 0}
    ckpt.write(offsets)
    assert ckpt.read() == offsets
    assert ckpt.path.read_bytes() == b"0\n2\nmy.app-store-changelog 12 9223372036854775807\nx 0 0\n"


def test_tuple_keys_are_accepted_and_read_back_as_topic_partitions(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({("t", 3): 4})  # type: ignore[dict-item]
    (tp,) = ckpt.read()
    assert isinstance(tp, TopicPartition) and str(tp) == "t-3"


def test_topic_with_whitespace_is_refused(ckpt: OffsetCheckpoint) -> None:
    with pytest.raises(ValueError, match="topic name"):
        ckpt.write({TP("a b", 0): 1})


def test_entry_lines_split_on_ascii_whitespace_only_as_kafka_does(ckpt: OffsetCheckpoint) -> None:
    """Java's ``\\s`` is ASCII whitespace: a no-break space or U+2028 inside a field stays in the field."""
    ckpt.path.write_bytes("0\n2\na\u00a0b 0 5\nc\u2028d\t1  6\n".encode())
    assert ckpt.read() == {TP("a\u00a0b", 0): 5, TP("c\u2028d", 1): 6}
    ckpt.path.write_bytes("0\n1\nt 0\u00a05\n".encode())  # Kafka: two fields, the second not a number
    with pytest.raises(CheckpointError, match=":3: malformed line"):
        ckpt.read()


# -- bad input: every malformed variant names the file and the line -----------------------------

MALFORMED = {
    "empty file": (b"", 1),
    "only a newline": (b"\n", 1),
    "unknown version": (b"1\n1\ntopic 0 1\n", 1),
    "negative version": (b"-1\n0\n", 1),
    "non-numeric version": (b"zero\n0\n", 1),
    "version with spaces": (b" 0\n0\n", 1),
    "garbage": (b"abcdefg", 1),
    "missing count": (b"0\n", 2),
    "non-numeric count": (b"0\nx\n", 2),
    "negative count": (b"0\n-1\n", 2),
    "count too high": (b"0\n2\ntopic 0 1\n", 3),
    "count too low": (b"0\n1\ntopic 0 1\ntopic 1 2\n", 4),
    "duplicate partition": (b"0\n2\ntopic 0 1\ntopic 0 2\n", 4),
    "two fields": (b"0\n1\ntopic 0\n", 3),
    "four fields": (b"0\n1\ntopic 0 1 2\n", 3),
    "leading whitespace": (b"0\n1\n topic 0 1\n", 3),
    "blank line": (b"0\n1\n\ntopic 0 1\n", 3),
    "non-numeric partition": (b"0\n1\ntopic x 1\n", 3),
    "non-numeric offset": (b"0\n1\ntopic 0 1.5\n", 3),
    "partition out of int32 range": (b"0\n1\ntopic 2147483648 1\n", 3),
    "offset out of int64 range": (b"0\n1\ntopic 0 9223372036854775808\n", 3),
    "underscore digits": (b"0\n1\ntopic 0 1_000\n", 3),
    "not utf-8": (b"0\n1\ntopic\xff 0 1\n", None),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_file_raises_checkpoint_error_naming_file_and_line(
    ckpt: OffsetCheckpoint, name: str
) -> None:
    data, line = MALFORMED[name]
    ckpt.path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        ckpt.read()
    msg = str(info.value)
    assert str(ckpt.path) in msg
    if line is not None:
        assert f"{ckpt.path}:{line}:" in msg
    assert info.value.path == str(ckpt.path)


def test_trailing_whitespace_on_entry_is_tolerated_like_java_split(ckpt: OffsetCheckpoint) -> None:
    ckpt.path.write_bytes(b"0\n1\ntopic 0 5 \n")
    assert ckpt.read() == {TP("topic", 0): 5}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file_names_the_file(ckpt: OffsetCheckpoint) -> None:
    ckpt.write({TP("t", 0): 1})
    ckpt.path.chmod(0)
    with pytest.raises(CheckpointError, match=str(ckpt.path)):
        ckpt.read()


def test_checkpoint_that_is_a_directory_names_the_file(ckpt: OffsetCheckpoint) -> None:
    ckpt.path.mkdir()
    with pytest.raises(CheckpointError, match=str(ckpt.path)):
        ckpt.read()
