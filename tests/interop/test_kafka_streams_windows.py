"""Kafka Streams 4.4 starts on window and session stores statestore restored, and restores nothing.

The application (``interop/kafka-streams``, ``stores="windowed"``) counts its
input in 1-minute tumbling windows (``wcounts``: a timestamped window store,
retention 60 s) and in sessions of 30 s inactivity (``scounts``: a session
store, retention 30 s); both segment by the DSL's 60 s. Input record ``seq``
carries the timestamp ``first + seq * STEP`` (``first`` an hour ago: the
broker's retention deletes older records, of the input and of the
changelogs, whose retention is the store's plus a day), so windows and
sessions open, close and expire as the input goes, and most segments are
dropped along the way.

Run to completion under exactly_once_v2, ``inspect`` and ``verify`` report both stores of its own
state directory (every segment, the offset, no lag, data equal to the changelogs); then statestore restores both
stores into an empty state directory (``restore_many`` from the changelog
topics, or ``restore_on_spark`` from the broker's log directory): the segment
directories are Kafka Streams' own, segment for segment, with equal data,
each CLOSED. Kafka Streams started there restores nothing (its
StateRestoreListener says so), and after more input its windows and
sessions equal those of a second application that processed all the input
from scratch.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import _native
from support import kstreams_app
from support.kstreams_app import segments
from support.kstreams_checks import check_own_state
from support.model import store_difference

pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 150
#: The timestamp of input record 0: an hour ago, on a minute.
FIRST = kstreams_app.windowed_first_timestamp()


run = kstreams_app.windowed_runner("windowed", KEYS, PARTITIONS, FIRST)


@pytest.mark.parametrize("how", ["threads", pytest.param("spark", marks=pytest.mark.spark)])
def test_kafka_streams_starts_on_window_and_session_stores_statestore_restored(
    app_built: Path, kafka_broker: Any, tmp_path: Path, request: pytest.FixtureRequest, how: str
) -> None:
    kafka_bootstrap = str(kafka_broker.bootstrap)
    app = f"ksn{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    ran = run(kafka_bootstrap, app, first, produce=3000)
    assert ran.closed_clean
    # inspect and verify report Kafka Streams' own stores: segments, offsets, no lag, equal to the changelogs
    check_own_state(kafka_bootstrap, first, app, kstreams_app.WINDOWED_STORES, PARTITIONS, "kip-1035")

    # statestore rebuilds both stores into an empty state directory
    restored = tmp_path / "restored"
    stores = kstreams_app.WINDOWED_STORES
    if how == "spark":
        spark = request.getfixturevalue("spark")
        kstreams_app.restore_with_spark(spark, Path(kafka_broker.log_dir), app, restored, stores, PARTITIONS)
    else:
        kstreams_app.restore_with_threads(kafka_bootstrap, app, restored, stores, PARTITIONS)

    # the segments Kafka Streams itself holds, segment for segment, with the same data, each CLOSED
    for p in range(PARTITIONS):
        for name in kstreams_app.WINDOWED_STORES:
            theirs, ours = first / app / f"0_{p}" / name, restored / app / f"0_{p}" / name
            names = segments(theirs)
            assert names and segments(ours) == names, (name, p, segments(ours), names)
            for seg in names:
                assert store_difference(theirs / seg, ours / seg) is None, (name, p, seg)
                assert _native.store_info(ours / seg).status == _native.STATUS_CLOSED

    # Kafka Streams, restore only: nothing to restore
    only = kstreams_app.run_app(
        kafka_bootstrap,
        app,
        restored,
        guarantee="exactly_once_v2",
        mode="restore",
        stores="windowed",
        partitions=PARTITIONS,
        keys=KEYS,
    )
    assert only.restored_records == 0, only.restores
    assert all(r.start == r.end or r.restored == 0 for r in only.restores.values()), only.restores

    # then 1,000 more records on that state: nothing restored, and the windows and sessions equal those
    # of an application that processed all 4,000 from scratch
    ref = kstreams_app.check_more_input(
        functools.partial(run, kafka_bootstrap), app, restored, tmp_path / "ref", produced=3000
    )
    assert ref.stores.keys() == {"wcounts", "scounts"}
    assert int(ref.stores["wcounts"]["entries"]) > 0 and int(ref.stores["scounts"]["entries"]) > 0
