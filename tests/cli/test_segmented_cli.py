"""``statestore restore`` of window and session stores (Kafka Streams' segmented stores).

The changelog is a segment log of window (or session) keys whose windows
all live within the retention, so Kafka Streams' store is every record in
its segment ``<task>/<store>/<store>.<segmentId * interval>``, ``segmentId =
timestamp / interval`` (a window's start, a session's end) and the interval
the DSL's, ``max(retention / 2, 60 s)``. A store whose retention is not
given, or that the changelog's ``retention.ms`` contradicts, is reported and
nothing of it written.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from statestore import _native
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.discovery import discover_stores
from statestore.state.store_kinds import WINDOW_OR_SESSION
from statestore.state.topology import parse_topology
from support.cli import restore_args
from support.cli import run_cli as cli

APP = "shop"
RETENTION = 600_000
INTERVAL = _native.dsl_segment_interval(RETENTION)
BASE = 1_700_000_000_000
TOPOLOGY = """Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [input])
      --> KSTREAM-AGGREGATE-0000000001, KSTREAM-AGGREGATE-0000000002
    Processor: KSTREAM-AGGREGATE-0000000001 (stores: [counts])
      --> none
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-AGGREGATE-0000000002 (stores: [win])
      --> none
      <-- KSTREAM-SOURCE-0000000000
"""


def topic(store: str) -> str:
    return f"{APP}-{store}-changelog"


def segment_time(fmt: str, key: bytes) -> int:
    """The timestamp a key's segment is chosen by: a window's start, a session's end."""
    return int(struct.unpack(">q", key[-12:-4] if fmt != "session" else key[-16:-8])[0])


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """Changelogs of two partitions, the same records in each: ``win`` (window keys), ``sess``
    (session keys), ``counts`` (key-value); :func:`expected_segments` is what they make."""
    log = SegmentLog(tmp_path / "log", sync=False)
    producer = log.producer("writer")
    producer.begin()
    for p in (0, 1):
        for i in range(30):
            start = BASE + 60_000 * (i % 8)  # 8 minutes of windows: within the retention, 2-3 segments
            user = b"user-%d" % (i % 5)
            producer.send(topic("win"), p, user + struct.pack(">qi", start, 0), b"%d" % i, timestamp=start)
            producer.send(
                topic("sess"), p, user + struct.pack(">qq", start + 30_000, start), b"%d" % i, timestamp=start
            )
            producer.send(topic("counts"), p, user, b"%d" % i)
    producer.commit()
    producer.close()
    log.close()
    (tmp_path / "topology.txt").write_text(TOPOLOGY)
    return tmp_path


def expected_segments(fmt: str, store: str) -> dict[str, dict[bytes, bytes]]:
    """What Kafka Streams holds in partition 0 of ``store`` after the fixture's records."""
    want: dict[str, dict[bytes, bytes]] = {}
    for i in range(30):
        start = BASE + 60_000 * (i % 8)
        user = b"user-%d" % (i % 5)
        key = user + (
            struct.pack(">qq", start + 30_000, start) if fmt == "session" else struct.pack(">qi", start, 0)
        )
        value = b"%d" % i
        if fmt == "timestamped-window":
            value = struct.pack(">q", start) + value
        want.setdefault(f"{store}.{segment_time(fmt, key) // INTERVAL * INTERVAL}", {})[key] = value
    return want


def on_disk(store: Path) -> tuple[dict[str, dict[bytes, bytes]], set[int | None]]:
    """The segments at ``store`` and the offsets of partition 0 they record."""
    data, offsets = {}, set()
    for seg in sorted(store.iterdir()):
        dump = _native.store_dump(seg)
        data[seg.name] = dict(dump.entries)
        offsets.add(dump.offsets.get(f"{topic(store.name)}-0"))
    return data, offsets


@pytest.mark.parametrize(
    ("store", "fmt"), [("win", "timestamped-window"), ("win", "window"), ("sess", "session")]
)
def test_restore_writes_the_segments_of_a_window_or_session_store(app: Path, store: str, fmt: str) -> None:
    out = cli(
        *restore_args(
            app,
            APP,
            "--store",
            store,
            "--store-format",
            f"{store}={fmt}",
            "--retention",
            f"{store}={RETENTION}",
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout
    want = expected_segments(fmt, store)
    assert len(want) >= 2, "more than one segment"
    assert on_disk(app / "state" / APP / "0_0" / store) == (want, {29})
    assert (app / "state" / APP / "0_1" / store).is_dir()
    assert not (app / "state" / APP / "0_0" / "rocksdb" / store).exists(), "not a key-value store"
    again = cli(
        *restore_args(
            app,
            APP,
            "--store",
            store,
            "--store-format",
            f"{store}={fmt}",
            "--retention",
            f"{store}={RETENTION}",
        )
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert on_disk(app / "state" / APP / "0_0" / store) == (want, {29}), "resumed, nothing changed"


def test_a_topology_finds_the_window_store_beside_a_key_value_store(app: Path) -> None:
    out = cli(
        *restore_args(
            app,
            APP,
            "--topology",
            str(app / "topology.txt"),
            "--store-format",
            "counts=timestamped",
            "--store-format",
            "win=timestamped-window",
            "--retention",
            f"win={RETENTION}",
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 ok, 0 failed, 0 stores not restored" in out.stdout
    assert on_disk(app / "state" / APP / "0_0" / "win") == (
        expected_segments("timestamped-window", "win"),
        {29},
    )
    assert (app / "state" / APP / "0_1" / "rocksdb" / "counts").is_dir()


def test_a_window_store_without_its_retention_is_reported_and_nothing_written(app: Path) -> None:
    out = cli(*restore_args(app, APP, "--store", "win", "--store", "counts", "--store-format", "win=window"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 ok, 0 failed, 1 stores not restored" in out.stdout
    assert "not restored: store win (sub-topology 0): it is a window store" in out.stdout
    assert "give --retention win=MS" in out.stdout
    assert not any((app / "state").glob(f"{APP}/*/win")) and not any(
        (app / "state").glob(f"{APP}/*/rocksdb/win")
    )
    assert (app / "state" / APP / "0_0" / "rocksdb" / "counts").is_dir(), "the other store is restored"
    topo = cli(
        *restore_args(
            app,
            APP,
            "--topology",
            str(app / "topology.txt"),
            "--store",
            "win",
            "--store-format",
            "win=timestamped-window",
        )
    )
    assert topo.returncode == 1, topo.stdout + topo.stderr
    assert "0 ok, 0 failed, 1 stores not restored" in topo.stdout and "give --retention win=MS" in topo.stdout
    assert not any((app / "state").glob(f"{APP}/*/win"))


def test_before_kafka_streams_4_3_a_window_store_is_refused(app: Path) -> None:
    out = cli(
        *restore_args(
            app,
            APP,
            "--store",
            "win",
            "--store-format",
            "win=timestamped-window",
            "--retention",
            f"win={RETENTION}",
            "--kafka-streams-version",
            "4.2",
        )
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "not written yet for that layout" in out.stdout
    assert not any((app / "state").glob(f"{APP}/*/win"))


def test_a_retention_needs_a_window_or_session_format_or_a_topology(app: Path) -> None:
    for extra in ([], ["--store-format", "counts=plain"]):
        out = cli(*restore_args(app, APP, "--store", "counts", "--retention", "counts=1000", *extra))
        assert out.returncode == 2, out.stdout + out.stderr
        assert "--retention counts=1000" in out.stderr and "--store-format counts=" in out.stderr
    assert not (app / "state").exists()


# -- discovery: the retention against the changelog's retention.ms -------------------------------------


def test_a_retention_larger_than_the_changelogs_retention_ms_contradicts_it() -> None:
    topology = parse_topology(TOPOLOGY)
    windowed = {"cleanup.policy": "compact,delete", "retention.ms": "86700000"}

    def win(retention: int, config: dict[str, str] = windowed) -> tuple[str | None, str | None]:
        found = discover_stores(
            topology,
            APP,
            changelog_topics={topic("win")},
            topic_configs={topic("win"): config},
            names={"win": None},
            formats={"win": "timestamped-window"},
            retentions={"win": retention},
        )[0]
        return found.kind, found.refusal

    assert win(RETENTION) == (WINDOW_OR_SESSION, None)
    assert win(86_700_000) == (WINDOW_OR_SESSION, None), "no additional retention: equal is consistent"
    kind, refusal = win(86_700_001)
    assert kind == WINDOW_OR_SESSION and refusal is not None
    assert "--retention win=86700001 contradicts its changelog shop-win-changelog" in refusal
    assert "retention.ms=86700000" in refusal
    assert win(86_700_001, {**windowed, "retention.ms": "-1"}) == (WINDOW_OR_SESSION, None), "unlimited"
    missing = discover_stores(
        topology,
        APP,
        changelog_topics={topic("win")},
        topic_configs={topic("win"): windowed},
        names={"win": None},
        formats={"win": "session"},
    )[0]
    assert missing.refusal is not None and "give --retention win=MS" in missing.refusal


def test_a_retention_given_for_a_key_value_store_is_reported() -> None:
    found = discover_stores(
        parse_topology(TOPOLOGY),
        APP,
        changelog_topics={topic("counts")},
        topic_configs={topic("counts"): {"cleanup.policy": "compact"}},
        names={"counts": None},
        formats={"counts": "timestamped"},
        retentions={"counts": RETENTION},
    )[0]
    assert (
        found.refusal is not None
        and "a retention belongs to window, session and versioned stores" in found.refusal
    )


@pytest.mark.spark
def test_the_spark_engine_writes_the_segments_with_the_retention_given(app: Path) -> None:
    pytest.importorskip("pyspark")
    flags = ["--store", "sess", "--store-format", "sess=session", "--retention", f"sess={RETENTION}"]
    out = cli(*restore_args(app, APP, "--engine", "spark", "--master", "local[2]", *flags))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout
    assert on_disk(app / "state" / APP / "0_0" / "sess") == (expected_segments("session", "sess"), {29})
