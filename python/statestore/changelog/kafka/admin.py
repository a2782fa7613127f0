"""Topics of a Kafka cluster for changelogs: list, create (compacted), delete, and check (confluent-kafka admin)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from statestore.changelog.kafka.common import kafka_error, require
from statestore.errors import LogError
from statestore.ids import TopicPartition, changelog_topic

if TYPE_CHECKING:
    from statestore.changelog.kafka import KafkaChangelog


class KafkaAdmin:
    """The topics of the cluster a :class:`~statestore.changelog.kafka.KafkaChangelog` names."""

    def __init__(self, changelog: KafkaChangelog) -> None:
        self._changelog = changelog
        self._lock = threading.Lock()
        self._client: Any = None

    def client(self) -> Any:
        """The confluent-kafka ``AdminClient`` (made on first use)."""
        with self._lock:
            if self._client is None:
                require()
                from confluent_kafka.admin import AdminClient

                self._client = AdminClient(self._changelog.client_config({}))
            return self._client

    def topics(self) -> dict[str, int]:
        """Every topic of the cluster and its partition count."""
        md = self.client().list_topics(timeout=self._changelog.request_timeout)
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}

    def topic_partitions(self, topic: str) -> int | None:
        """Number of partitions of ``topic``, None if it does not exist."""
        # A metadata request naming the topic may create it on brokers that
        # auto-create topics: list them all instead.
        return self.topics().get(topic)

    def partitions(self) -> list[TopicPartition]:
        """Every partition of every topic (internal topics excluded), sorted."""
        return sorted(
            TopicPartition(name, p)
            for name, n in self.topics().items()
            if not name.startswith("__")
            for p in range(n)
        )

    def create_topics(
        self,
        topics: Mapping[str, int],
        *,
        config: Mapping[str, str] | None = None,
        replication_factor: int = -1,
    ) -> None:
        """Create ``topic -> partitions`` as compacted changelog topics (``cleanup.policy=compact``).

        ``replication_factor=-1`` takes the broker's default.
        """
        if not topics:
            return
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        cl = self._changelog
        conf = {"cleanup.policy": "compact", **(config or {})}
        new = [
            NewTopic(t, num_partitions=n, replication_factor=replication_factor, config=dict(conf))
            for t, n in topics.items()
        ]
        futures = self.client().create_topics(new, request_timeout=cl.request_timeout)
        ck = require()
        for topic, fut in futures.items():
            try:
                fut.result(cl.request_timeout)
            except Exception as e:
                err = kafka_error(e)
                if err is not None and err.code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # created meanwhile (e.g. by another instance starting too): checked below
                raise LogError(
                    f"creating changelog topic {topic} on {cl.bootstrap_servers} failed: {e}"
                ) from e
        # Judge the counts from the listing that showed every topic: on a cluster the next metadata
        # request may go to a broker that has not heard of a topic yet, which is no answer.
        seen: dict[str, int | None] = {}

        def all_seen() -> bool:
            listed = self.topics()
            seen.update({t: listed.get(t) for t in topics})
            return all(c is not None for c in seen.values())

        self._wait_for(all_seen, f"topics {sorted(topics)} to appear")
        for topic, n in topics.items():
            got = seen[topic]
            if got != n:
                raise LogError(
                    f"changelog topic {topic} on {cl.bootstrap_servers} was created meanwhile with "
                    f"{got} partitions, not {n}"
                )

    def delete_topics(self, topics: Iterable[str]) -> None:
        """Delete ``topics`` (missing ones are ignored)."""
        names = list(topics)
        if not names:
            return
        cl = self._changelog
        futures = self.client().delete_topics(names, request_timeout=cl.request_timeout)
        ck = require()
        for topic, fut in futures.items():
            try:
                fut.result(cl.request_timeout)
            except ck.KafkaException as e:
                err = kafka_error(e)
                if err is None or err.code() != ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise LogError(f"deleting topic {topic} on {cl.bootstrap_servers} failed: {e}") from e
        self._wait_for(lambda: all(self.topic_partitions(t) is None for t in names), f"topics {names} to go")

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Every config of each of ``topics`` (defaults included), by topic; a missing topic is left out."""
        names = list(topics)
        if not names:
            return {}
        ck = require()
        from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

        cl = self._changelog
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
        futures = self.client().describe_configs(resources, request_timeout=cl.request_timeout)
        out: dict[str, dict[str, str]] = {}
        for resource, fut in futures.items():
            try:
                entries = fut.result(cl.request_timeout)
            except ck.KafkaException as e:
                err = kafka_error(e)
                if err is not None and err.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise LogError(
                    f"reading the configs of topic {resource.name} on {cl.bootstrap_servers} failed: {e}"
                ) from e
            out[resource.name] = {k: v.value for k, v in entries.items() if v.value is not None}
        return out

    def _wait_for(self, cond: Callable[[], bool], what: str) -> None:
        cl = self._changelog
        deadline = time.monotonic() + cl.request_timeout
        while not cond():
            if time.monotonic() > deadline:
                raise LogError(f"{cl!r}: timed out after {cl.request_timeout:.0f} s waiting for {what}")
            time.sleep(0.05)


def ensure_changelog_topics(
    changelog: KafkaChangelog,
    application_id: str,
    stores: Iterable[str],
    partitions: int,
    *,
    create: bool = True,
    config: Mapping[str, str] | None = None,
) -> list[str]:
    """Make sure every store's changelog topic exists with ``partitions`` partitions (one per task).

    Missing topics are created compacted (``create=True``). An existing topic
    with another partition count raises ``LogError``: tasks map to changelog
    partitions one to one, so such a changelog would restore the wrong data.
    Returns the topics created.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    existing = changelog.topics()
    missing: dict[str, int] = {}
    for store in stores:
        topic = changelog_topic(application_id, store)
        n = existing.get(topic)
        if n is None:
            missing[topic] = partitions
        elif n != partitions:
            raise LogError(
                f"changelog topic {topic} on {changelog.bootstrap_servers} has {n} partitions but the application "
                f"has {partitions} tasks per store; refusing to run (a changelog partition belongs to one task): "
                "fix the topic or the partition count"
            )
    if missing and not create:
        raise LogError(
            f"changelog topics {sorted(missing)} do not exist on {changelog.bootstrap_servers}; "
            "create them (ensure_changelog_topics(..., create=True))"
        )
    changelog.create_topics(missing, config=config)
    return sorted(missing)


__all__ = ["KafkaAdmin", "ensure_changelog_topics"]
