"""Creating changelog topics on a cluster whose brokers learn of a new topic one after another."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from statestore.changelog.kafka.admin import KafkaAdmin
from statestore.errors import LogError


class Done:
    """A create_topics future that succeeded."""

    def result(self, timeout: float | None = None) -> None:
        return None


class Cluster:
    """An AdminClient whose metadata requests go to brokers in turn, the odd ones not yet told of
    the topics just created (as on a 3-node cluster right after CreateTopics)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.created: list[str] = []
        self.listings = 0

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, Done]:
        self.created = [t.topic for t in new]
        return {t: Done() for t in self.created}

    def list_topics(self, timeout: float) -> Any:
        self.listings += 1
        knows = self.listings % 2 == 1
        topics = {
            t: SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
            for t in (self.created if knows else [])
        }
        return SimpleNamespace(topics=topics)


def admin_of(cluster: Cluster) -> KafkaAdmin:
    admin = KafkaAdmin(SimpleNamespace(request_timeout=5.0, bootstrap_servers="b1:9092,b2:9092"))  # type: ignore[arg-type]
    admin._client = cluster
    return admin


def test_topics_created_are_judged_by_the_listing_that_showed_them() -> None:
    cluster = Cluster(partitions=4)
    admin_of(cluster).create_topics({"app-a-changelog": 4, "app-b-changelog": 4})
    assert cluster.listings == 1, "the first listing showed both topics, and it was the one judged"


def test_a_topic_created_meanwhile_with_other_partitions_is_refused() -> None:
    with pytest.raises(LogError, match="was created meanwhile with 3 partitions, not 4"):
        admin_of(Cluster(partitions=3)).create_topics({"app-a-changelog": 4})
