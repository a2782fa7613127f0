"""``statestore restore`` of header-aware stores (Kafka Streams 4.3+, ``dsl.store.format=headers``).

The changelog is a segment log whose records carry headers; ``--store-format
NAME=timestamped-headers`` (or ``timestamped-window-headers``,
``session-headers`` with ``--retention``) writes Kafka Streams' header-aware
store, alone or with ``--topology``, and a store found on disk tells its own
format. Kafka Streams before 4.3 has no such store: with
``--kafka-streams-version 4.2`` it is refused and nothing of it written.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from statestore import _native
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.discovery import discover_stores
from statestore.state.store_kinds import KEY_VALUE, WINDOW_OR_SESSION
from statestore.state.topology import parse_topology
from support.cli import restore_args
from support.cli import run_cli as cli

APP = "shop"
RETENTION = 600_000
BASE = 1_700_000_000_000
TOPOLOGY = """Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [input])
      --> KSTREAM-AGGREGATE-0000000001, KSTREAM-AGGREGATE-0000000002
    Processor: KSTREAM-AGGREGATE-0000000001 (stores: [counts])
      --> none
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-AGGREGATE-0000000002 (stores: [sess])
      --> none
      <-- KSTREAM-SOURCE-0000000000
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """Changelogs of one partition: ``counts`` (key-value) and ``sess`` (session keys), each record
    with the header ``h: <i>``."""
    log = SegmentLog(tmp_path / "log", sync=False)
    producer = log.producer("writer")
    producer.begin()
    for i in range(20):
        user = b"user-%d" % (i % 4)
        ts = BASE + 1000 * i
        hs = [("h", b"%d" % i)]
        producer.send(f"{APP}-counts-changelog", 0, user, b"%d" % i, hs, timestamp=ts)
        producer.send(
            f"{APP}-sess-changelog", 0, user + struct.pack(">qq", ts, ts - 500), b"%d" % i, hs, timestamp=ts
        )
    producer.commit()
    producer.close()
    log.close()
    (tmp_path / "topology.txt").write_text(TOPOLOGY)
    return tmp_path


def stored(i: int, session: bool = False) -> bytes:
    """The header-aware value of record ``i``: varint(len H) ‖ H ‖ [timestamp ‖] value, H = the one header."""
    h = bytes([2, 2]) + b"h" + bytes([2 * len(b"%d" % i)]) + b"%d" % i
    stamp = b"" if session else struct.pack(">q", BASE + 1000 * i)
    return bytes([2 * len(h)]) + h + stamp + b"%d" % i


def test_restore_writes_a_header_aware_key_value_and_session_store(app: Path) -> None:
    out = cli(
        *restore_args(
            app,
            APP,
            "--store-format",
            "counts=timestamped-headers",
            "--store-format",
            "sess=session-headers",
            "--retention",
            f"sess={RETENTION}",
            "--topology",
            str(app / "topology.txt"),
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr
    task = app / "state" / APP / "0_0"
    counts = task / "rocksdb" / "counts"
    assert _native.store_format(counts) == "timestamped-headers"
    assert dict(_native.store_dump(counts).entries) == {
        b"user-%d" % (i % 4): stored(i) for i in range(16, 20)
    }
    (segment,) = sorted((task / "sess").iterdir())
    assert _native.store_format(segment) == "session-headers"
    assert len(_native.store_dump(segment).entries) == 20
    assert set(dict(_native.store_dump(segment).entries).values()) == {
        stored(i, session=True) for i in range(20)
    }

    # the store on disk tells its format: again without --store-format counts=..., it resumes
    again = cli(*restore_args(app, APP, "--store", "counts", "--topology", str(app / "topology.txt")))
    assert again.returncode == 0, again.stdout + again.stderr
    found = discover_stores(
        parse_topology(TOPOLOGY),
        APP,
        changelog_topics={f"{APP}-counts-changelog", f"{APP}-sess-changelog"},
        state_dir=app / "state",
    )
    counts_found = next(f for f in found if f.name == "counts")
    assert (counts_found.kind, counts_found.format, counts_found.refusal) == (
        KEY_VALUE,
        "timestamped-headers",
        None,
    )


def test_before_kafka_streams_4_3_a_header_aware_store_is_refused(app: Path) -> None:
    for fmt, extra in (
        ("timestamped-headers", []),
        ("session-headers", ["--retention", f"sess={RETENTION}"]),
    ):
        name = "counts" if fmt == "timestamped-headers" else "sess"
        out = cli(
            *restore_args(
                app,
                APP,
                "--store",
                name,
                "--store-format",
                f"{name}={fmt}",
                *extra,
                "--kafka-streams-version",
                "4.2",
            )
        )
        assert out.returncode == 1, out.stdout + out.stderr
        assert "only since 4.3" in out.stdout, out.stdout
        assert not (app / "state" / APP / "0_0" / "rocksdb" / "counts").exists()
        assert not (app / "state" / APP / "0_0" / "sess").exists()


def test_the_kind_of_each_header_aware_format() -> None:
    from statestore.state.store_kinds import KIND_OF_FORMAT

    assert KIND_OF_FORMAT["timestamped-headers"] == KEY_VALUE
    assert KIND_OF_FORMAT["timestamped-window-headers"] == WINDOW_OR_SESSION
    assert KIND_OF_FORMAT["session-headers"] == WINDOW_OR_SESSION
    assert KIND_OF_FORMAT["emit-final-window-headers"] == WINDOW_OR_SESSION
    assert set(_native.HEADERS_STORE_FORMATS) == {
        "timestamped-headers",
        "timestamped-window-headers",
        "session-headers",
        "emit-final-window-headers",
    }


def test_a_header_aware_store_restored_from_no_committed_record_records_no_offset_yet(tmp_path: Path) -> None:
    """As for every key-value store (``test_sentinel_offsets.py``): else Kafka Streams, under
    exactly_once_v2, takes the task for corrupted."""
    log = SegmentLog(tmp_path / "log", sync=False)
    producer = log.producer("writer")
    producer.begin()
    producer.send(
        f"{APP}-counts-changelog", 1, b"k", b"aborted", [("h", b"x")]
    )  # partition 1: none committed
    producer.abort()
    producer.begin()
    producer.send(f"{APP}-counts-changelog", 0, b"k", b"v", [("h", b"x")])
    producer.commit()
    producer.close()
    log.close()
    out = cli(
        *restore_args(tmp_path, APP, "--store", "counts", "--store-format", "counts=timestamped-headers")
    )
    assert out.returncode == 0, out.stdout + out.stderr
    empty = _native.store_dump(tmp_path / "state" / APP / "0_1" / "rocksdb" / "counts")
    assert (empty.entries, empty.offsets, empty.status) == (
        [],
        {f"{APP}-counts-changelog-1": _native.OFFSET_UNKNOWN},
        _native.STATUS_CLOSED,
    )
    assert (
        _native.store_format(tmp_path / "state" / APP / "0_1" / "rocksdb" / "counts") == "timestamped-headers"
    )
