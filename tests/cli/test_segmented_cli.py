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

import json
import re
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from statestore import OffsetCheckpoint, TopicPartition, _native
from statestore.changelog.segment_log import SegmentLog
from statestore.restore.discovery import discover_stores
from statestore.state.layout import CHECKPOINT, store_layout, table_format_versions
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


def test_a_topology_meets_the_segments_on_disk(app: Path) -> None:
    """With ``--topology``, a window store already on disk tells its format (timestamped segments), and a
    topology that does not name it disagrees with the state directory."""
    restore_window(app, "win", "timestamped-window")
    topology = ["--topology", str(app / "topology.txt")]
    out = cli(*restore_args(app, APP, *topology, "--store", "win", "--retention", f"win={RETENTION}"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout, out.stdout
    (app / "other.txt").write_text(TOPOLOGY.replace("(stores: [win])", "(stores: [other])"))
    state = ["--state-dir", str(app / "state"), "--app-id", APP, "--log-dir", str(app / "log")]
    out = cli("inspect", *state, "--topology", str(app / "other.txt"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "store win in" in out.stderr and "is not in the topology" in out.stderr, out.stderr


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


def unwrapped(table: str) -> str:
    """The text of a rich table with its cells' line breaks undone (empty cells and borders dropped)."""
    return re.sub(r"[│\s]+", " ", table)


def restore_window(app: Path, store: str, fmt: str, *extra: str, retention: int = RETENTION) -> None:
    """``statestore restore`` of the window or session store ``store`` in ``fmt``; it must succeed."""
    out = cli(
        *restore_args(
            app,
            APP,
            "--store",
            store,
            "--store-format",
            f"{store}={fmt}",
            "--retention",
            f"{store}={retention}",
            *extra,
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr


def inspect_json(app: Path, *extra: str) -> list[dict[str, Any]]:
    out = cli(
        "inspect",
        "--state-dir",
        str(app / "state"),
        "--app-id",
        APP,
        "--log-dir",
        str(app / "log"),
        "--json",
        *extra,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    stores: list[dict[str, Any]] = json.loads(out.stdout)["stores"]
    return stores


def verify(app: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "verify", "--state-dir", str(app / "state"), "--app-id", APP, "--log-dir", str(app / "log"), *extra
    )


@pytest.mark.parametrize(
    ("store", "fmt"),
    [("win", "emit-final-window"), ("win", "emit-final-sliding-window"), ("sess", "emit-final-session")],
)
def test_an_emit_final_store_is_written_for_the_checkpoint_layout(app: Path, store: str, fmt: str) -> None:
    """For Kafka Streams 4.2: the segments and rows of the 4.4 layout, each segment without its offsets
    family and at format_version 5, the offset in the task's ``.checkpoint``."""
    restore_window(app, store, fmt, "--kafka-streams-version", "4.2")
    (app / "state").rename(app / "legacy")
    restore_window(app, store, fmt)
    for p in (0, 1):
        legacy, current = (app / d / APP / f"0_{p}" / store for d in ("legacy", "state"))
        segs = sorted(d.name for d in current.iterdir())
        assert segs and sorted(d.name for d in legacy.iterdir()) == segs
        for seg in segs:
            assert _native.store_dump(legacy / seg).entries == _native.store_dump(current / seg).entries
            assert store_layout(legacy / seg) is CHECKPOINT and table_format_versions(legacy / seg) == {5}
        assert OffsetCheckpoint(legacy.parent / ".checkpoint").read() == {TopicPartition(topic(store), p): 29}


@pytest.mark.parametrize(
    ("store", "fmt"), [("win", "timestamped-window"), ("win", "window"), ("sess", "session")]
)
@pytest.mark.parametrize("version", ["4.4", "4.2"])
def test_inspect_and_verify_report_a_window_or_session_store(
    app: Path, store: str, fmt: str, version: str
) -> None:
    restore_window(app, store, fmt, "--kafka-streams-version", version)
    want = expected_segments(fmt, store)
    legacy = version == "4.2"
    for p in (0, 1):
        task = app / "state" / APP / f"0_{p}"
        segs = sorted(d.name for d in (task / store).iterdir())
        assert segs == sorted(want)
        for seg in segs:
            assert {k: v for k, v in _native.store_dump(task / store / seg).entries} == want[seg]
            # the .checkpoint layout: no offsets family (Kafka Streams 3.6 - 4.2 cannot open one), format_version 5
            assert (store_layout(task / store / seg) is CHECKPOINT) == legacy
            if legacy:
                assert table_format_versions(task / store / seg) == {5}
        checkpoint = OffsetCheckpoint(task / ".checkpoint")
        assert checkpoint.read() == ({TopicPartition(topic(store), p): 29} if legacy else {})

    given = [] if fmt == "timestamped-window" else ["--store-format", f"{store}={fmt}"]
    for flags in ([], given):
        reports = inspect_json(app, *flags)
        assert [(r["task_id"], r["store"]) for r in reports] == [("0_0", store), ("0_1", store)]
        for r in reports:
            assert r["problem"] is None and r["kind"] == WINDOW_OR_SESSION, r
            assert r["layout"] == ("checkpoint" if legacy else "kip-1035"), r
            assert (r["store_offset"], r["checkpoint_offset"]) == ((None, 29) if legacy else (29, None)), r
            assert r["lag"] == 0 and r["status"] == ("none" if legacy else "closed"), r
            assert [s["directory"] for s in r["segments"]] == sorted(want), r
            assert {s["store_offset"] for s in r["segments"]} == ({None} if legacy else {29}), r
            if fmt == "timestamped-window" or flags:
                assert (r["format"], r["format_note"]) == (fmt, None), r
            else:  # plain segments: a window or a session store, the bytes do not tell which
                assert r["format"] is None and f"--store-format {store}=window|session" in r["format_note"], r

    # verify needs what the bytes do not tell, and says so
    out = verify(app, *given)
    assert out.returncode == 1 and out.stdout.count("NOT VERIFIED") == 2, out.stdout + out.stderr
    assert f"give --retention {store}=MS" in out.stderr and "2 of 2 stores not verified" in out.stderr, (
        out.stderr
    )
    if given:
        out = verify(app, "--retention", f"{store}={RETENTION}")
        assert out.returncode == 1 and out.stdout.count("NOT VERIFIED") == 2, out.stdout + out.stderr
        assert f"give --store-format {store}=window|session" in out.stderr, out.stderr
    out = verify(app, *given, "--retention", f"{store}={RETENTION}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("exact") == 2, out.stdout

    # a changed value in one segment is a mismatch naming the segment
    seg = sorted(want)[-1]
    key = next(iter(want[seg]))
    _native._testing.store_write_batch(app / "state" / APP / "0_1" / store / seg, [(key, b"changed")], {})
    out = verify(app, *given, "--retention", f"{store}={RETENTION}")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("exact") == 1 and "MISMATCH" in out.stdout, out.stdout
    assert f"segment {seg}" in out.stderr and "0_1" in out.stderr, out.stderr


def test_segments_written_with_another_interval_are_a_usage_error_naming_one(app: Path) -> None:
    restore_window(app, "win", "timestamped-window")
    store = app / "state" / APP / "0_0" / "win"
    before = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    # retention 140 s: the DSL's interval is 70 s, which the 300 s segments on disk do not start on
    out = cli(
        *restore_args(
            app,
            APP,
            "--store",
            "win",
            "--store-format",
            "win=timestamped-window",
            "--retention",
            "win=140000",
        )
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--retention win=140000" in out.stderr and "segment interval" in out.stderr, out.stderr
    assert any(str(store / name) in out.stderr for name in before), out.stderr
    assert {p.name: p.stat().st_mtime_ns for p in store.iterdir()} == before, "nothing written"
    # inspect with that retention reports it as the store's problem
    reports = inspect_json(app, "--retention", "win=140000")
    assert "segment interval" in (reports[0]["problem"] or ""), reports[0]


#: A column family no Kafka Streams store has (yet).
UNKNOWN_FAMILY = "keyValueWithTimestampAndSomethingNew"


def test_a_segment_of_a_type_statestore_does_not_know_is_reported_and_never_written(app: Path) -> None:
    """A window store whose segments hold a column family statestore does not know (one a newer Kafka
    Streams might bring): inspect and verify name it, and restore leaves it as it is."""
    seg = app / "state" / APP / "0_0" / "win" / f"win.{BASE // INTERVAL * INTERVAL}"
    seg.parent.mkdir(parents=True)
    opts = Options(raw_mode=True)
    opts.create_missing_column_families(True)
    db = Rdict(str(seg), opts, column_families={UNKNOWN_FAMILY: Options(raw_mode=True)})
    db.get_column_family(UNKNOWN_FAMILY)[b"k"] = b"v"
    db.close()
    families = Rdict.list_cf(str(seg))
    reports = inspect_json(app)
    assert [r["store"] for r in reports] == ["win"]
    assert "statestore does not know" in reports[0]["problem"] and UNKNOWN_FAMILY in reports[0]["problem"]
    out = verify(app, "--retention", f"win={RETENTION}")
    assert out.returncode == 1 and "UNREADABLE" in out.stdout, out.stdout + out.stderr
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
        )
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 ok, 1 failed" in out.stdout and "statestore does not know" in unwrapped(out.stdout), out.stdout
    assert Rdict.list_cf(str(seg)) == families and sorted(p.name for p in seg.parent.iterdir()) == [seg.name]
    # and plain segments are never taken for a timestamped window store's
    out = cli(
        *restore_args(
            app, APP, "--store", "sess", "--store-format", "sess=session", "--retention", f"sess={RETENTION}"
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = cli(
        *restore_args(
            app,
            APP,
            "--store",
            "sess",
            "--store-format",
            "sess=timestamped-window",
            "--retention",
            f"sess={RETENTION}",
        )
    )
    assert out.returncode == 1 and "does not fit its segments" in unwrapped(out.stdout), out.stdout


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
@pytest.mark.parametrize("version", ["4.4", "4.2"])
def test_the_spark_engine_writes_the_segments_with_the_retention_given(app: Path, version: str) -> None:
    pytest.importorskip("pyspark")
    flags = ["--store", "sess", "--store-format", "sess=session", "--retention", f"sess={RETENTION}"]
    flags += ["--kafka-streams-version", version]
    out = cli(*restore_args(app, APP, "--engine", "spark", "--master", "local[2]", *flags))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout
    legacy = version == "4.2"
    store = app / "state" / APP / "0_0" / "sess"
    assert on_disk(store) == (expected_segments("session", "sess"), {None} if legacy else {29})
    # the .checkpoint layout: each segment without its offsets family, the offset in the task's .checkpoint
    assert all((store_layout(seg) is CHECKPOINT) == legacy for seg in store.iterdir())
    assert OffsetCheckpoint(store.parent / ".checkpoint").read() == (
        {TopicPartition(topic("sess"), 0): 29} if legacy else {}
    )
