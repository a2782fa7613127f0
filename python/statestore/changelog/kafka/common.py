"""What the Kafka modules share: the optional confluent-kafka import, configuration keys, defaults."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from statestore.errors import ChangelogUnavailableError, TransactionInDoubtError

_ck: Any
try:
    import confluent_kafka as _ck
except ImportError:  # pragma: no cover - exercised only without the extra
    _ck = None

#: Where librdkafka's own log lines go.
CLIENT_LOG = logging.getLogger("statestore.changelog.kafka.client")

#: Default seconds a broker call may take, retries included (one attempt: a third, or socket.timeout.ms).
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Default seconds a restore may see no progress before giving up.
DEFAULT_STALL_TIMEOUT = 60.0
#: Seconds one ``consume()`` call waits at most.
POLL_TIMEOUT = 0.05


def require() -> Any:
    """The ``confluent_kafka`` module, or ImportError saying how to install it."""
    if _ck is None:
        raise ImportError(
            "statestore's Kafka changelog needs confluent-kafka: pip install 'statestore[kafka]'"
        )
    return _ck


def kafka_error(e: BaseException) -> Any:
    """The ``KafkaError`` inside a ``KafkaException`` (or None)."""
    args = getattr(e, "args", ())
    return args[0] if args and hasattr(args[0], "code") else None


def unanswered(e: BaseException) -> bool:
    """Whether ``e`` says the cluster gave no answer in time, or one to ask again, rather than a
    refusal: a :class:`~statestore.errors.ChangelogUnavailableError` (the native client's), a
    :class:`~statestore.errors.TransactionInDoubtError` of a commit whose retries got none, or a
    confluent-kafka error (or a statestore error caused by one) that is retriable, a timeout, a
    transport error, or a coordinator's "not now"."""
    if isinstance(e, ChangelogUnavailableError) or isinstance(e.__cause__, ChangelogUnavailableError):
        return True
    if isinstance(e, TransactionInDoubtError):
        return e.__cause__ is not None  # a commit's retries that got none, not a refused abort
    if _ck is None:
        return False
    err = kafka_error(e if isinstance(e, _ck.KafkaException) else (e.__cause__ or e))
    if err is None:
        return False
    return bool(err.retriable()) or err.code() in (
        _ck.KafkaError._TIMED_OUT,
        _ck.KafkaError._TRANSPORT,
        _ck.KafkaError._ALL_BROKERS_DOWN,
        _ck.KafkaError.REQUEST_TIMED_OUT,
        _ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        _ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
        _ck.KafkaError.NOT_COORDINATOR,
        _ck.KafkaError.UNSTABLE_OFFSET_COMMIT,
    )


#: confluent-kafka's own (Python) configuration keys, which keep their underscores.
PYTHON_KEYS = frozenset(
    {"error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_commit", "on_delivery", "logger"}
)


def client_properties(pairs: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka properties; ``security_protocol=...`` may be written for ``security.protocol``."""
    return {k if k in PYTHON_KEYS else k.replace("_", "."): v for k, v in pairs.items()}


def parse_properties(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (as command lines give them) as properties; ``ValueError`` names a bad one."""
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()
    return props
