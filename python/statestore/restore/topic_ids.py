"""The topic id a store's records were read under, kept beside the store.

A changelog topic deleted and recreated under its old name starts its
offsets at 0 again, so a store restored from the old topic may record an
offset that lies inside the new one: offsets alone cannot tell, and reading
on from there would mix two topics in one store without a word. Kafka names
every topic with an id (Metadata v10+, Kafka 2.8+). After a restore through
the native fetcher, the id the store's records were read under is written
beside the store (``.<store>.topic-id``, as the ``.<store>.unsynced`` marker
is: Kafka Streams refuses unknown files inside a window or session store's
directory). Before the next restore of the store -- in this process or in
another, after a restart -- the client holds the reads going on from the
store's offset to that id (``KafkaClient.hold_to``), so a topic found under
another id is :class:`~statestore.errors.TaskCorruptedError`: the task
manager wipes the task and restores it from the new topic.

The file is advisory and written without a sync: lost or unreadable, it
leaves the next restore to take the topic as it finds it, as every restore
did before the file existed. A restore from the log start is never held (it
reads the topic as it is now). Stores restored through confluent-kafka (the
fallback for settings the native fetcher cannot serve) get no such file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from statestore import _native
from statestore.errors import StateStoreError
from statestore.ids import TopicPartition

logger = logging.getLogger(__name__)

#: Ends the name of the file beside a store that names the topic id its records were read under.
TOPIC_ID_SUFFIX = ".topic-id"


def topic_id_path(store: Path) -> Path:
    """Where the topic id of ``store``'s records is kept: ``.<store>.topic-id`` beside it."""
    return store.parent / f".{store.name}{TOPIC_ID_SUFFIX}"


def recorded_topic_id(store: Path, tp: TopicPartition) -> str | None:
    """The topic id recorded beside ``store`` for ``tp``; None when none is (or the file is unreadable,
    or names another partition: a warning says so, and the next restore writes it anew)."""
    path = topic_id_path(store)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        logger.warning(
            "%s cannot be read (%s): the restore of %s takes the topic as it finds it", path, e, tp
        )
        return None
    fields = text.split()
    if len(fields) == 3 and fields[0] == tp.topic and fields[1] == str(tp.partition):
        return fields[2]
    logger.warning(
        "%s does not name a topic id of %s (%r): the restore takes the topic as it finds it",
        path,
        tp,
        text[:200],
    )
    return None


@dataclass(frozen=True)
class HeldStore:
    """A store about to be restored through a native Kafka client, with the topic id recorded beside it."""

    client: _native.KafkaClient
    tp: TopicPartition
    store: Path
    recorded: str | None


def native_client_of(changelog: object) -> _native.KafkaClient | None:
    """The native Kafka client a restore from ``changelog`` reads through (a ``KafkaChangelog``'s,
    or the client itself), else None."""
    client = changelog if isinstance(changelog, _native.KafkaClient) else getattr(changelog, "native", None)
    return client if isinstance(client, _native.KafkaClient) else None


def hold(changelog: object, tp: TopicPartition, store: Path) -> HeldStore | None:
    """Before a restore of ``store`` from ``changelog``: hold the reads going on from the store's offset
    to the topic id recorded beside it. None when ``changelog`` is not read through a native client."""
    client = native_client_of(changelog)
    if client is None:
        return None
    recorded = recorded_topic_id(store, tp)
    if recorded is not None:
        try:
            client.hold_to(tp.topic, tp.partition, recorded)
        except StateStoreError as e:
            logger.warning("%s: %s; the restore takes the topic as it finds it", topic_id_path(store), e)
            recorded = None
    return HeldStore(client, tp, store, recorded)


def record(held: HeldStore | None) -> None:
    """After a successful restore: write the topic id its records were read under beside the store,
    if it is not the one already there. A failed write is a warning, never a failed restore."""
    if held is None:
        return
    now = held.client.topic_id(held.tp.topic, held.tp.partition)
    if now is None or now == held.recorded or not held.store.exists():
        return
    path = topic_id_path(held.store)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(f"{held.tp.topic} {held.tp.partition} {now}\n")
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("cannot record the topic id of %s in %s: %s", held.store, path, e)


def move(src: Path, dst: Path) -> None:
    """Move the topic id recorded beside store ``src`` to beside ``dst`` (a staged store put in place);
    none beside ``src`` removes the one beside ``dst``."""
    try:
        os.replace(topic_id_path(src), topic_id_path(dst))
    except FileNotFoundError:
        topic_id_path(dst).unlink(missing_ok=True)


def copy(src: Path, dst: Path) -> None:
    """Copy the topic id recorded beside store ``src`` to beside ``dst`` (its staged copy), if any."""
    try:
        data = topic_id_path(src).read_bytes()
    except FileNotFoundError:
        return
    topic_id_path(dst).write_bytes(data)


__all__ = [
    "TOPIC_ID_SUFFIX",
    "HeldStore",
    "copy",
    "hold",
    "move",
    "native_client_of",
    "record",
    "recorded_topic_id",
    "topic_id_path",
]
