"""Which stores a Kafka Streams application has, where each lives, and what kind each is.

The topology description (:mod:`statestore.state.topology`) gives every
store its subtopology; the changelog topics' configs give its kind
(:mod:`statestore.state.store_kinds`); what neither can tell -- plain or
timestamped, a window store's retention -- comes from the user's per-store
flags, else from the store already on disk. A store whose kind or format
cannot be established is reported, never guessed; a kind statestore does not
write yet is reported and never opened for writing.

A topology that names a store with no changelog, or that disagrees with the
state directory (a store on disk in a task of another subtopology, a store
the topology does not name), is a :class:`~statestore.errors.TopologyError`
naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from statestore import _native
from statestore.errors import StateStoreError, TopologyError
from statestore.ids import TaskId, changelog_topic
from statestore.state.segmented import read_segmented, task_store_dirs
from statestore.state.store_kinds import (
    KIND_OF_FORMAT,
    VERSIONED,
    WINDOW_OR_SESSION,
    WRITTEN,
    history_retention_from_topic_config,
    kind_from_topic_config,
)
from statestore.state.topology import Topology


@dataclass(frozen=True)
class FoundStore:
    """One store of the application as discovery established it."""

    name: str
    subtopology: int
    #: ``store_kinds.KEY_VALUE``, ``WINDOW_OR_SESSION``, ``VERSIONED``; None: not established.
    kind: str | None
    #: The format the store is written in (``plain``/``timestamped``/``timestamped-headers`` for a
    #: key-value store, ``timestamped-window``/``window``/``session``, their header-aware
    #: ``-headers`` forms and the ``emit-final-*`` ones for a segmented one, ``versioned``); None: not
    #: established.
    format: str | None
    #: The retention the user gave (``--retention``), milliseconds; for a versioned store its history
    #: retention, else its changelog's ``min.compaction.lag.ms`` less a day; None: not known.
    retention_ms: int | None
    #: Why statestore does not restore it (kind or format unknown, a kind it does not write yet);
    #: None when it restores it.
    refusal: str | None = None


def _on_disk(state_dir: Path | None, application_id: str) -> dict[str, list[tuple[TaskId, Path, bool]]]:
    """Store name -> ``(task, directory, segmented)`` of each task holding it in the application's
    state directory (``rocksdb/<store>``, or a window or session store's ``<store>`` of segments)."""
    found: dict[str, list[tuple[TaskId, Path, bool]]] = {}
    root = None if state_dir is None else state_dir / application_id
    if root is None or not root.is_dir():
        return found
    for task_dir in sorted(root.iterdir()):
        try:
            task = TaskId.parse(task_dir.name)
        except ValueError:
            continue
        if task_dir.is_dir():
            for name, path, segmented in task_store_dirs(task_dir):
                found.setdefault(name, []).append((task, path, segmented))
    return found


def check_state_dir(topology: Topology, state_dir: Path, application_id: str) -> None:
    """``TopologyError`` when the state directory holds a store the topology does not name, or a
    store in a task of another subtopology than the topology gives it."""
    for name, where in _on_disk(state_dir, application_id).items():
        tasks = [t for t, _, _ in where]
        known = topology.task_stores.get(name)
        if known is None:
            raise TopologyError(
                f"{topology.source or '<topology>'}: store {name} in {state_dir / application_id} "
                f"(task {tasks[0]}) is not in the topology; is it the application's topology?",
                path=topology.source,
            )
        wrong = [t for t in tasks if t.subtopology != known.subtopology]
        if wrong:
            raise TopologyError(
                f"{topology.where(name)}: store {name} is in sub-topology {known.subtopology}, but "
                f"{next(p for t, p, _ in where if t == wrong[0])} is in task {wrong[0]}",
                path=topology.source,
                line=known.line,
            )


def discover_stores(
    topology: Topology,
    application_id: str,
    *,
    changelog_topics: Collection[str],
    topic_configs: Mapping[str, Mapping[str, str]] | None = None,
    names: Mapping[str, int | None] | None = None,
    formats: Mapping[str, str] | None = None,
    retentions: Mapping[str, int] | None = None,
    state_dir: Path | None = None,
) -> list[FoundStore]:
    """Every store of ``topology`` that lives in tasks (or those ``names`` lists), sorted by name.

    ``changelog_topics`` are the topics the changelog holds; ``topic_configs``
    their configs where known (Kafka; a segment log has none). ``names`` maps
    a store to the subtopology the command line gave it (``--store NAME@N``),
    or None. ``formats`` and ``retentions`` are the per-store flags. With
    ``state_dir``, it is checked against the topology (:func:`check_state_dir`)
    and a store found there tells its own format.
    """
    fmts, rets = dict(formats or {}), dict(retentions or {})
    where = topology.source or "<topology>"
    stores = topology.task_stores
    wanted = dict(names) if names else dict.fromkeys(stores)
    for flag in (fmts, rets):
        for name in flag:
            if name not in stores:
                raise TopologyError(f"{where}: no store {name} in the topology", path=topology.source)
    if state_dir is not None:
        check_state_dir(topology, state_dir, application_id)
    disk = _on_disk(state_dir, application_id)
    found = []
    for name, sub in sorted(wanted.items()):
        known = stores.get(name)
        if known is None:
            raise TopologyError(f"{where}: no store {name} in the topology", path=topology.source)
        if sub is not None and sub != known.subtopology:
            raise TopologyError(
                f"{topology.where(name)}: store {name} is in sub-topology {known.subtopology}, not {sub}",
                path=topology.source,
                line=known.line,
            )
        topic = changelog_topic(application_id, name)
        if topic not in changelog_topics:
            raise TopologyError(
                f"{topology.where(name)}: store {name} has no changelog {topic} (logging disabled, or "
                "another application id?)",
                path=topology.source,
                line=known.line,
            )
        found.append(_establish(name, known.subtopology, topic, topic_configs, fmts, rets, disk))
    return found


def _establish(
    name: str,
    sub: int,
    topic: str,
    topic_configs: Mapping[str, Mapping[str, str]] | None,
    fmts: Mapping[str, str],
    rets: Mapping[str, int],
    disk: Mapping[str, list[tuple[TaskId, Path, bool]]],
) -> FoundStore:
    """The kind and format of one store, from the changelog's configs, the flags and the disk."""
    config = None if topic_configs is None else topic_configs.get(topic)
    by_config = None if config is None else kind_from_topic_config(config)
    fmt = fmts.get(name)
    by_flag = None if fmt is None else KIND_OF_FORMAT.get(fmt)
    if fmt is None and by_config == VERSIONED:
        # its bytes look like a plain store's: the changelog says what it is, and it has one format
        fmt, by_flag = WRITTEN[VERSIONED][0], VERSIONED
    if fmt is None and name in disk:
        _task, path, segmented = disk[name][0]
        try:
            if segmented:
                # its segments tell a timestamped window store; plain ones a window or session store
                fmt = read_segmented(path).format
                by_flag = WINDOW_OR_SESSION
            else:
                fmt = _native.store_format(path)
                by_flag = None if fmt is None else KIND_OF_FORMAT.get(fmt)
        except StateStoreError:
            fmt = by_flag = None
    kind = by_config or by_flag
    retention = rets.get(name)
    if retention is None and kind == VERSIONED and config is not None:
        retention = history_retention_from_topic_config(config)

    def refused(why: str) -> FoundStore:
        return FoundStore(name, sub, kind, fmt, retention, why)

    if by_config is not None and by_flag is not None and by_config != by_flag:
        return refused(
            f"its changelog {topic} is a {by_config} store's (cleanup.policy="
            f"{config.get('cleanup.policy') if config else '?'}), but its format {fmt} is a {by_flag} store's"
        )
    if kind is None:
        if config is not None:
            return refused(
                f"its changelog {topic}'s configs name no store kind ({dict(config)}); not guessed"
            )
        return refused(
            "its kind is unknown (no changelog configs to tell it, no --store-format, no store on disk); "
            "not guessed"
        )
    if kind not in WRITTEN:
        return refused(f"it is a {kind} store, which statestore does not write yet; never opened for writing")
    if fmt is None:
        return refused(
            f"its format is unknown: give --store-format {name}={'|'.join(WRITTEN[kind])} "
            "(neither the changelog nor its bytes tell them apart); not guessed"
        )
    why = segmented_refusal(name, topic, fmt, retention, config)
    if why is not None:
        return refused(why)
    return FoundStore(name, sub, kind, fmt, retention)


#: The formats written for the ``.checkpoint`` layout of Kafka Streams 3.6 - 4.2, each proven with
#: Kafka Streams 3.9 and 4.2 themselves (``tests/interop/``: the checkpoint-layout, emit-final,
#: versioned and more-windows tests): every format but the header-aware ones, which came with 4.3.
CHECKPOINT_LAYOUT_FORMATS: tuple[str, ...] = (
    "plain",
    "timestamped",
    "window",
    "timestamped-window",
    "session",
    "emit-final-window",
    "emit-final-sliding-window",
    "emit-final-session",
    "versioned",
)


def layout_refusal(fmt: str, *, offsets_in_store: bool) -> str | None:
    """Why a store of format ``fmt`` is not written for a layout (None: it is). With
    ``offsets_in_store=False`` (the ``.checkpoint`` layout of Kafka Streams 3.6 - 4.2) a
    header-aware store does not exist (Kafka Streams has it since 4.3); any other format outside
    :data:`CHECKPOINT_LAYOUT_FORMATS` is not written for it."""
    if offsets_in_store or fmt in CHECKPOINT_LAYOUT_FORMATS:
        return None
    if fmt in _native.HEADERS_STORE_FORMATS:
        return (
            f"it is a {fmt} store, which Kafka Streams has only since 4.3 (dsl.store.format=headers), "
            "so it is never written for the .checkpoint layout of Kafka Streams 3.6 - 4.2 "
            "(--kafka-streams-version); restore it for Kafka Streams 4.3+"
        )
    return (
        f"it is a {fmt} store, not written yet for that layout (the .checkpoint layout of Kafka "
        "Streams 3.6 - 4.2, --kafka-streams-version); restore it for Kafka Streams 4.3+"
    )


def segmented_refusal(
    name: str,
    topic: str,
    fmt: str,
    retention_ms: int | None,
    topic_config: Mapping[str, str] | None = None,
    *,
    offsets_in_store: bool = True,
) -> str | None:
    """Why store ``name`` (changelog ``topic``, format ``fmt``) is not restored with ``retention_ms``;
    None when it is.

    A window or session store needs its retention (``--retention``), which
    neither the changelog's bytes nor a segment log tell: it is never
    guessed; so does a versioned store its history retention (from a segment
    log, which has no topic configs). Kafka Streams sets the changelog's ``retention.ms`` to the
    store's retention plus ``windowstore.changelog.additional.retention.ms``
    (>= 0), so a larger retention than the topic's contradicts the changelog.
    With ``offsets_in_store=False`` (the ``.checkpoint`` layout of Kafka
    Streams 3.6 - 4.2) a header-aware, versioned or emit-final store is not
    written (:func:`layout_refusal`). A retention given for a key-value store
    is a mistake in the flags, reported too.
    """
    why = layout_refusal(fmt, offsets_in_store=offsets_in_store)
    if why is not None:
        return why
    if fmt not in _native.RETAINED_STORE_FORMATS:
        if retention_ms is not None:
            return (
                f"--retention {name}={retention_ms} is given, but it is a {fmt} key-value store; a "
                "retention belongs to window, session and versioned stores"
            )
        return None
    if fmt in _native.VERSIONED_STORE_FORMATS:
        if retention_ms is None:
            return (
                f"it is a {fmt} store, whose history retention its changelog's bytes do not tell: give "
                f"--retention {name}=MS (milliseconds; with --kafka, min.compaction.lag.ms of its "
                "changelog less a day); not guessed"
            )
        return None
    if retention_ms is None:
        return (
            f"it is a {fmt} store, whose retention neither its changelog's bytes nor its segments tell: "
            f"give --retention {name}=MS (milliseconds); not guessed"
        )
    try:
        topic_retention = int((topic_config or {}).get("retention.ms", "-1") or "-1")
    except ValueError:
        topic_retention = -1
    if topic_retention >= 0 and retention_ms > topic_retention:
        return (
            f"--retention {name}={retention_ms} contradicts its changelog {topic}: retention.ms="
            f"{topic_retention}, which Kafka Streams sets to the store's retention plus "
            "windowstore.changelog.additional.retention.ms (>= 0), so the store's retention is at most "
            f"{topic_retention}"
        )
    return None


__all__ = ["FoundStore", "check_state_dir", "discover_stores", "layout_refusal", "segmented_refusal"]
