"""TaskId and TopicPartition: the names every other layer uses."""

from __future__ import annotations

import pytest

from statestore import TaskId, TopicPartition, changelog_topic


def test_task_id_string_form_and_parse() -> None:
    assert str(TaskId(0, 1)) == "0_1"
    assert TaskId.parse("0_1") == TaskId(0, 1)
    assert TaskId.parse("12_305") == TaskId(12, 305)


@pytest.mark.parametrize(
    "bad", ["", "0", "0_", "_1", "a_1", "0_b", "0_1_2", "-1_0", "0_-1", " 0_1", "0_1 ", "01_1", "0.1"]
)
def test_task_id_parse_rejects_bad_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="task id"):
        TaskId.parse(bad)


def test_topic_partition_string_form_and_parse() -> None:
    tp = TopicPartition("app-store-changelog", 3)
    assert str(tp) == "app-store-changelog-3"
    assert TopicPartition.parse("app-store-changelog-3") == tp
    with pytest.raises(ValueError):
        TopicPartition.parse("nopartition")


def test_changelog_topic_name() -> None:
    assert changelog_topic("app", "counts") == "app-counts-changelog"
