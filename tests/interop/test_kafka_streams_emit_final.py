"""Kafka Streams 4.4, 4.2 and 3.9 start on emit-final window and session stores statestore restored, and
restore nothing.

The application (``interop/kafka-streams``, ``stores="emit-final"``) counts
its input in 1-minute tumbling windows, in sliding windows of 1 minute and in
sessions of 30 s inactivity, each with ``emitStrategy(onWindowClose())``
(``wcounts``: Kafka Streams' time-ordered window store, retention 60 s, base
rows keyed ``0x00 ‖ window start ‖ key ‖ seqnum``; ``swcounts``: the same,
retention 120 s, with index rows ``0x01 ‖ key ‖ window start ‖ seqnum``;
``scounts``: its time-ordered session store,
retention 30 s, base rows ``0x00 ‖ end ‖ start ‖ key`` and index rows
``0x01 ‖ key ‖ end ‖ start``); and the same under ``dsl.store.format=headers``:
window segments of ``windowKeyValueWithHeaders`` with index rows, session
segments of ``sessionKeyValueWithHeaders`` whose values hold no headers. The
input's timestamps step as in ``test_kafka_streams_windows.py``, so windows
close and segments expire.

Run to completion under exactly_once_v2, then statestore restores the stores
into an empty state directory from their changelogs (4.4: ``restore_many``;
3.9 and 4.2, without the header-aware variant that came with 4.3:
``statestore restore --kafka-streams-version``, the ``.checkpoint`` layout):
the segments are Kafka Streams' own, byte for byte (4.4: each CLOSED; 3.9 and
4.2: no offsets family, table ``format_version`` 5 at most, each task's
``.checkpoint`` equal to Kafka Streams' own). Kafka Streams started there
restores nothing, and after more input its windows and sessions equal those of
a second application that processed all the input from scratch.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import _native
from support import kstreams_app
from support.kstreams_app import segments, store_path
from support.kstreams_checks import check_layout, check_own_state
from support.model import store_contents, store_difference

pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 150
FIRST = kstreams_app.windowed_first_timestamp()


@pytest.mark.parametrize(
    ("version", "headers"),
    [(kstreams_app.NEWEST, False), (kstreams_app.NEWEST, True)]
    + [(v, False) for v in kstreams_app.CHECKPOINT_LAYOUT_VERSIONS],
    ids=lambda v: {False: "default", True: "headers"}.get(v, v),
)
def test_kafka_streams_starts_on_emit_final_window_stores_statestore_restored(
    kafka_broker: Any, tmp_path: Path, version: str, headers: bool
) -> None:
    kstreams_app.built(version)
    legacy = kstreams_app.layout_of(version) == "checkpoint"
    stores = kstreams_app.EMIT_FINAL_HEADERS_STORES if headers else kstreams_app.EMIT_FINAL_STORES
    config = {"dsl.store.format": "headers"} if headers else {}
    runner = kstreams_app.windowed_runner("emit-final", KEYS, PARTITIONS, FIRST, config)

    def run(app: str, state: Path, **kw: Any) -> kstreams_app.AppRun:
        return runner(kafka_bootstrap, app, state, version=version, **kw)

    kafka_bootstrap = str(kafka_broker.bootstrap)
    app = f"kse{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    assert run(app, first, produce=3000).closed_clean
    # statestore inspect and verify on Kafka Streams' own state directory: every store, its segments
    check_own_state(kafka_bootstrap, first, app, stores, PARTITIONS, kstreams_app.layout_of(version))

    restored = tmp_path / "restored"
    if legacy:
        kstreams_app.restore_with_cli(kafka_bootstrap, app, restored, stores, version)
    else:
        kstreams_app.restore_with_threads(kafka_bootstrap, app, restored, stores, PARTITIONS)
    check_layout(first, restored, app, version)

    # Kafka Streams' own segments, byte for byte: time-first base rows, and index rows where it has them
    for p in range(PARTITIONS):
        for name, (fmt, _) in stores.items():
            theirs, ours = store_path(first, app, p, name, fmt), store_path(restored, app, p, name, fmt)
            names = segments(theirs)
            assert names and segments(ours) == names, (name, p, segments(ours), names)
            for seg in names:
                assert store_difference(theirs / seg, ours / seg) is None, (name, p, seg)
                if not legacy:
                    assert _native.store_info(ours / seg).status == _native.STATUS_CLOSED
                on_disk = {"emit-final-window-headers": fmt, "emit-final-session-headers": "session-headers"}
                assert _native.store_format(ours / seg) == on_disk.get(fmt, "plain")
                prefixes = {k[0] for k in store_contents(theirs / seg).data}
                assert prefixes == ({0} if fmt == "emit-final-window" else {0, 1}), (name, p, seg, prefixes)

    # Kafka Streams restores nothing there, and its results after more input are exact
    ref = kstreams_app.check_more_input(run, app, restored, tmp_path / "ref", produced=3000)
    assert all(int(ref.stores[name]["entries"]) > 0 for name in stores), ref.stores
