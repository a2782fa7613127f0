"""The topic id a store's records were read under, kept beside the store.

A changelog topic deleted and recreated under its old name starts its
offsets at 0 again, so a store restored from the old topic may record an
offset that lies inside the new one: offsets alone cannot tell, and reading
on from there would mix two topics in one store without a word. Kafka names
every topic with an id (Metadata v10+, Kafka 2.8+). After a restore through
the native fetcher, the id the store's records were read under is written
beside the store (``.<store>.topic-id``, as the ``.<store>.unsynced`` marker
is: Kafka Streams refuses unknown files inside a window or session store's
directory). The next restore of the store -- in this process or in another,
after a restart -- is given that id (``RestoreSpec.topic_id``), and its
fetcher holds the reads going on from the store's offset to it, so a topic
found under another id is :class:`~statestore.errors.TaskCorruptedError`:
the task manager wipes the task and restores it from the new topic. The id
is the store's own, so other stores of the partition, restored before or
beside it, do not change what it is held to.

The file is advisory and written without a sync: lost or unreadable, it
leaves the next restore to take the topic as it finds it, as every restore
did before the file existed. A restore from the log start is never held (it
reads the topic as it is now). Stores restored through confluent-kafka (the
fallback for settings the native fetcher cannot serve) get no such file.
Changelogs moved to another cluster keep their offsets but not their ids:
:func:`forget` (``statestore clean --topic-ids``) removes every record.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from statestore import _native
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
        try:
            return str(uuid.UUID(fields[2]))
        except ValueError:
            pass
    logger.warning(
        "%s does not name a topic id of %s (%r): the restore takes the topic as it finds it",
        path,
        tp,
        text[:200],
    )
    return None


def is_native(changelog: object) -> bool:
    """Whether a restore from ``changelog`` reads through the native Kafka client (a
    ``KafkaChangelog``'s, or the client itself): only those reads know topic ids."""
    client = changelog if isinstance(changelog, _native.KafkaClient) else getattr(changelog, "native", None)
    return isinstance(client, _native.KafkaClient)


def held_topic_id(changelog: object, tp: TopicPartition, store: Path) -> str | None:
    """Before a restore of ``store`` from ``changelog``: the topic id to hold the reads going on from
    the store's offset to, as recorded beside it. A record beside a store that is not there (wiped
    by hand, or by a tool that left the file) no longer stands, and is removed."""
    if not is_native(changelog):
        return None
    if not store.exists():
        topic_id_path(store).unlink(missing_ok=True)
        return None
    return recorded_topic_id(store, tp)


def record(store: Path, tp: TopicPartition, recorded: str | None, read_under: str | None) -> None:
    """After a successful restore of ``store`` that read records under topic id ``read_under``:
    record it beside the store, unless it is ``recorded`` (the one there before the restore). A
    restore that read nothing under an id leaves the record as it is. A failed write is a warning,
    never a failed restore."""
    if read_under is None or read_under == recorded or not store.exists():
        return
    path = topic_id_path(store)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(f"{tp.topic} {tp.partition} {read_under}\n")
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("cannot record the topic id of %s in %s: %s", store, path, e)


def move(src: Path, dst: Path) -> None:
    """Move the topic id recorded beside store ``src`` to beside ``dst`` (a staged store put in place);
    none beside ``src`` removes the one beside ``dst``. A failure is a warning: the store is in place."""
    try:
        try:
            os.replace(topic_id_path(src), topic_id_path(dst))
        except FileNotFoundError:
            topic_id_path(dst).unlink(missing_ok=True)
    except OSError as e:
        logger.warning("cannot move the topic id recorded beside %s to beside %s: %s", src, dst, e)


def copy(src: Path, dst: Path) -> None:
    """Copy the topic id recorded beside store ``src`` to beside ``dst`` (its staged copy), if any.
    A failure is a warning: the copy is restored as a store with none."""
    try:
        data = topic_id_path(src).read_bytes()
        topic_id_path(dst).write_bytes(data)
    except FileNotFoundError:
        return
    except OSError as e:
        logger.warning("cannot copy the topic id recorded beside %s to beside %s: %s", src, dst, e)


def forget(root: Path) -> list[Path]:
    """Remove every topic id recorded under ``root`` (a state directory, an application's, or a
    task's) and return the files removed. For changelogs moved to another cluster with their
    offsets: a mirror's topics have ids of their own, and each store held to the old id would be
    ``TaskCorruptedError`` once, wiped and restored in full. Only the files are touched."""
    removed = []
    for path in sorted(root.rglob(f".*{TOPIC_ID_SUFFIX}")):
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


__all__ = [
    "TOPIC_ID_SUFFIX",
    "copy",
    "forget",
    "held_topic_id",
    "is_native",
    "move",
    "record",
    "recorded_topic_id",
    "topic_id_path",
]
