"""What kind of store a changelog topic's configs say it belongs to, and which kinds statestore writes.

Kafka Streams creates each changelog topic with the configs of its store's
kind (``UnwindowedUnversionedChangelogTopicConfig``,
``VersionedChangelogTopicConfig``, ``WindowedChangelogTopicConfig``), so the
topic tells the kind where the bytes cannot:

============================================  ========================
changelog topic configs                       kind
============================================  ========================
``cleanup.policy=compact,delete``             window or session (``retention.ms`` = the store's retention + ``windowstore.changelog.additional.retention.ms``, 1 day by default)
``cleanup.policy=compact`` with ``min.compaction.lag.ms`` > 0  versioned (the lag = history retention + 1 day)
``cleanup.policy=compact``                    key-value
============================================  ========================

Neither the topic nor the bytes tell a plain key-value store from a
timestamped one (``--store-format``), nor a window store from a session
store. Nor do they tell a header-aware store (Kafka Streams 4.3+,
``dsl.store.format=headers``: ``timestamped-headers``,
``timestamped-window-headers``, ``session-headers``) from the store without
headers: both log the plain value with the record timestamp, a header-aware
store with the headers it keeps, the others with none (but Kafka Streams'
own ``v``/``c`` position headers under its IQ consistency option). A
changelog record with other headers therefore comes from a header-aware
store, but one without says nothing (its input had none), so the bytes are
no test either way. Only the store on disk tells (its column families,
``StoreFormat::detect``), or the application's ``dsl.store.format``.
A versioned store's bytes look like a plain store's (same column
families), so only its changelog (or ``--store-format NAME=versioned``) tells
it; its history retention is the changelog's ``min.compaction.lag.ms`` less
a day unless ``--retention`` says otherwise. Likewise an emit-final window or session store
(``emitStrategy(onWindowClose())``: ``emit-final-window``,
``emit-final-sliding-window``, ``emit-final-window-headers``, ``emit-final-session``,
``emit-final-session-headers``) logs the changelog of
any window or session store; only its store keys differ (time first, and
index rows). A kind statestore does not write yet is
reported store by store and never opened for writing.
"""

from __future__ import annotations

from collections.abc import Mapping

#: A key-value store (``Stores.persistentKeyValueStore``, or the DSL's timestamped one).
KEY_VALUE = "key-value"
#: A window or a session store (one RocksDB per time segment).
WINDOW_OR_SESSION = "window or session"
#: A versioned key-value store (``Stores.persistentVersionedKeyValueStore``).
VERSIONED = "versioned"

#: The kinds statestore writes, each with the formats it writes them in.
WRITTEN: dict[str, tuple[str, ...]] = {
    KEY_VALUE: ("plain", "timestamped", "timestamped-headers"),
    WINDOW_OR_SESSION: (
        "timestamped-window",
        "window",
        "session",
        "timestamped-window-headers",
        "session-headers",
        "emit-final-window",
        "emit-final-sliding-window",
        "emit-final-window-headers",
        "emit-final-session",
        "emit-final-session-headers",
    ),
    VERSIONED: ("versioned",),
}

#: What Kafka Streams adds to a versioned store's history retention for its changelog's
#: ``min.compaction.lag.ms`` (``VERSIONED_STORE_CHANGE_LOG_ADDITIONAL_COMPACTION_LAG_MS``, 1 day).
VERSIONED_ADDITIONAL_COMPACTION_LAG_MS = 86_400_000

#: The kind each format of ``--store-format`` belongs to.
KIND_OF_FORMAT: dict[str, str] = {fmt: kind for kind, fmts in WRITTEN.items() for fmt in fmts}


def history_retention_from_topic_config(config: Mapping[str, str]) -> int | None:
    """A versioned store's history retention as its changelog's configs say it (``min.compaction.lag.ms``
    less :data:`VERSIONED_ADDITIONAL_COMPACTION_LAG_MS`); None when they do not say."""
    try:
        lag = int(config.get("min.compaction.lag.ms", "") or "-1")
    except ValueError:
        return None
    history = lag - VERSIONED_ADDITIONAL_COMPACTION_LAG_MS
    return history if history >= 0 else None


def kind_from_topic_config(config: Mapping[str, str]) -> str | None:
    """The kind of store whose changelog topic has ``config``; None when the configs say none
    (a policy Kafka Streams never sets on a changelog, such as ``delete`` alone)."""
    policy = {p.strip() for p in config.get("cleanup.policy", "").split(",") if p.strip()}
    if policy == {"compact", "delete"}:
        return WINDOW_OR_SESSION
    if policy == {"compact"}:
        try:
            lag = int(config.get("min.compaction.lag.ms", "0") or "0")
        except ValueError:
            return None
        return VERSIONED if lag > 0 else KEY_VALUE
    return None


__all__ = [
    "KEY_VALUE",
    "KIND_OF_FORMAT",
    "VERSIONED",
    "VERSIONED_ADDITIONAL_COMPACTION_LAG_MS",
    "WINDOW_OR_SESSION",
    "WRITTEN",
    "history_retention_from_topic_config",
    "kind_from_topic_config",
]
