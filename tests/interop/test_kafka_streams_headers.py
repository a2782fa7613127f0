"""Kafka Streams 4.4 starts on header-aware stores statestore restored, and restores nothing.

The application (``interop/kafka-streams``, ``stores="headers"``, run under
``dsl.store.format=headers``) counts its input per key (``counts``: a
header-aware timestamped key-value store), in 1-minute tumbling windows
(``wcounts``: a window store of header-aware timestamped segments, retention
60 s) and in sessions of 30 s inactivity (``scounts``: a session store of
header-aware segments, retention 30 s). Kafka Streams 4.4's DSL stores no
headers in them (each value's H is empty), so a Processor API node keeps the
latest value of each key with its record's headers in a store of each kind
(``hlatest``, ``hwlatest``: one window a minute, ``hslatest``: a session per
30 s). Two of three input records carry headers (one, or three with a null
value), and the timestamps step as in ``test_kafka_streams_windows.py``.

Run to completion under exactly_once_v2, then statestore restores the three
stores into an empty state directory (``restore_many`` from the changelog
topics, or ``restore_on_spark`` from the broker's log directory): the stores
and segments are Kafka Streams' own, byte for byte (headers included), each
CLOSED. Kafka Streams started there restores nothing (its
StateRestoreListener says so), and after more input its counts, windows and
sessions equal those of a second application that processed all the input
from scratch. ``statestore inspect`` and ``verify`` read the application's
own state directory and name the key-value store's format.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import _native
from support import kstreams_app
from support.kstreams_app import HEADERS_STORES, segments, store_path
from support.kstreams_checks import check_own_state
from support.model import store_contents, store_difference

pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 150

#: The timestamp of input record 0: an hour ago, on a minute.
FIRST = kstreams_app.windowed_first_timestamp()

#: Kafka Streams' header-aware stores (Kafka Streams 4.3+).
HEADERS_CONFIG = {"dsl.store.format": "headers"}


run = kstreams_app.windowed_runner("headers", KEYS, PARTITIONS, FIRST, HEADERS_CONFIG)


def stored_headers(value: bytes) -> bytes:
    """H of a header-aware stored value, ``varint(len H) ‖ H ‖ ...`` (lengths below 64: one byte)."""
    assert value[0] < 128, value
    return value[1 : 1 + value[0] // 2]


@pytest.mark.parametrize("how", ["threads", pytest.param("spark", marks=pytest.mark.spark)])
def test_kafka_streams_starts_on_header_aware_stores_statestore_restored(
    app_built: Path, kafka_broker: Any, tmp_path: Path, request: pytest.FixtureRequest, how: str
) -> None:
    kafka_bootstrap = str(kafka_broker.bootstrap)
    app = f"ksh{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    ran = run(kafka_bootstrap, app, first, produce=3000)
    assert ran.closed_clean

    # Kafka Streams' own stores are the header-aware ones; the DSL's hold no headers, the others do
    counts0 = store_path(first, app, 0, "counts", "timestamped-headers")
    assert _native.store_format(counts0) == "timestamped-headers"
    assert {stored_headers(v) for v in store_contents(counts0).data.values()} == {b""}
    latest0 = store_path(first, app, 0, "hlatest", "timestamped-headers")
    theirs_headers = {stored_headers(v) for v in store_contents(latest0).data.values()}
    assert b"" in theirs_headers and len(theirs_headers) > 2, theirs_headers
    for name in ("scounts", "hslatest"):
        sessions = store_path(first, app, 0, name, "session-headers")
        assert {_native.store_format(sessions / s) for s in segments(sessions)} == {"session-headers"}

    # statestore rebuilds the three stores into an empty state directory
    restored = tmp_path / "restored"
    if how == "spark":
        spark = request.getfixturevalue("spark")
        kstreams_app.restore_with_spark(
            spark, Path(kafka_broker.log_dir), app, restored, HEADERS_STORES, PARTITIONS
        )
    else:
        kstreams_app.restore_with_threads(kafka_bootstrap, app, restored, HEADERS_STORES, PARTITIONS)

    # Kafka Streams' own stores, segment for segment, byte for byte, each CLOSED
    compared = 0
    for p in range(PARTITIONS):
        for name, (fmt, _) in HEADERS_STORES.items():
            theirs, ours = store_path(first, app, p, name, fmt), store_path(restored, app, p, name, fmt)
            if fmt not in _native.SEGMENTED_STORE_FORMATS:
                pairs = [(theirs, ours)]
            else:
                names = segments(theirs)
                assert names and segments(ours) == names, (name, p, segments(ours), names)
                pairs = [(theirs / seg, ours / seg) for seg in names]
            for t, o in pairs:
                assert store_difference(t, o) is None, (name, p, o)
                assert _native.store_format(o) == _native.store_format(t)
                assert _native.store_info(o).status == _native.STATUS_CLOSED
                compared += 1
    assert compared >= 3 * PARTITIONS

    if how == "threads":
        # statestore inspect and verify on the application's own state directory (before more input reaches
        # the changelogs): every store's format, segments, offsets, no lag, equal to its changelog
        check_own_state(kafka_bootstrap, first, app, HEADERS_STORES, PARTITIONS, "kip-1035")

    # Kafka Streams, restore only: nothing to restore
    only = kstreams_app.run_app(
        kafka_bootstrap,
        app,
        restored,
        guarantee="exactly_once_v2",
        mode="restore",
        stores="headers",
        partitions=PARTITIONS,
        keys=KEYS,
        config=HEADERS_CONFIG,
    )
    assert len(only.restores) == len(HEADERS_STORES) * PARTITIONS, only.restores
    assert only.restored_records == 0, only.restores
    assert all(r.start == r.end or r.restored == 0 for r in only.restores.values()), only.restores

    # then 1,000 more records on that state: nothing restored, and the counts, windows and sessions
    # equal those of an application that processed all 4,000 from scratch
    ref = kstreams_app.check_more_input(
        functools.partial(run, kafka_bootstrap), app, restored, tmp_path / "ref", produced=3000
    )
    assert ref.stores.keys() == set(HEADERS_STORES)
    assert all(int(ref.stores[name]["entries"]) > 0 for name in HEADERS_STORES), ref.stores
    assert int(ref.stores["counts"]["sum"]) == 4000
    assert any("source=interop,seq=" in v and "none=null" in v for v in ref.results["hlatest"].values())
