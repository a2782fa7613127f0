"""Stores found without hand-written flags: the topology description, the changelogs' configs, the flags.

``DESCRIBED`` is what Kafka Streams 4.4.0's ``Topology.describe()`` printed for
a topology with a Processor API store, a ``groupByKey().count()``, a
``groupBy(...).count()`` (its store in sub-topology 1, behind a repartition
topic), a tumbling and a session windowed count, and a global table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statestore import SegmentLog
from statestore._native import _testing
from statestore.errors import TopologyError
from statestore.restore.discovery import discover_stores
from statestore.state.store_kinds import KEY_VALUE, VERSIONED, WINDOW_OR_SESSION, kind_from_topic_config
from statestore.state.topology import parse_topology, read_topology
from support.cli import restore_args
from support.cli import run_cli as cli
from support.model import store_contents

DESCRIBED = "Topologies:\n   Sub-topology: 0\n    Source: KSTREAM-SOURCE-0000000000 (topics: [input])\n      --> KSTREAM-KEY-SELECT-0000000003, KSTREAM-AGGREGATE-0000000002, KSTREAM-AGGREGATE-0000000009, KSTREAM-AGGREGATE-0000000010, KSTREAM-PROCESSOR-0000000001\n    Processor: KSTREAM-KEY-SELECT-0000000003 (stores: [])\n      --> KSTREAM-FILTER-0000000007\n      <-- KSTREAM-SOURCE-0000000000\n    Processor: KSTREAM-FILTER-0000000007 (stores: [])\n      --> KSTREAM-SINK-0000000006\n      <-- KSTREAM-KEY-SELECT-0000000003\n    Processor: KSTREAM-AGGREGATE-0000000002 (stores: [counts])\n      --> none\n      <-- KSTREAM-SOURCE-0000000000\n    Processor: KSTREAM-AGGREGATE-0000000009 (stores: [tumbling])\n      --> none\n      <-- KSTREAM-SOURCE-0000000000\n    Processor: KSTREAM-AGGREGATE-0000000010 (stores: [sessions])\n      --> none\n      <-- KSTREAM-SOURCE-0000000000\n    Processor: KSTREAM-PROCESSOR-0000000001 (stores: [latest])\n      --> none\n      <-- KSTREAM-SOURCE-0000000000\n    Sink: KSTREAM-SINK-0000000006 (topic: KSTREAM-AGGREGATE-STATE-STORE-0000000004-repartition)\n      <-- KSTREAM-FILTER-0000000007\n\n  Sub-topology: 1\n    Source: KSTREAM-SOURCE-0000000008 (topics: [KSTREAM-AGGREGATE-STATE-STORE-0000000004-repartition])\n      --> KSTREAM-AGGREGATE-0000000005\n    Processor: KSTREAM-AGGREGATE-0000000005 (stores: [KSTREAM-AGGREGATE-STATE-STORE-0000000004])\n      --> none\n      <-- KSTREAM-SOURCE-0000000008\n\n  Sub-topology: 2 for global store (will not generate tasks)\n    Source: KSTREAM-SOURCE-0000000011 (topics: [global-input])\n      --> KTABLE-SOURCE-0000000012\n    Processor: KTABLE-SOURCE-0000000012 (stores: [global])\n      --> none\n      <-- KSTREAM-SOURCE-0000000011\n"

APP = "shop"
GROUPED = "KSTREAM-AGGREGATE-STATE-STORE-0000000004"
TASK_STORES = {"counts": 0, "latest": 0, "tumbling": 0, "sessions": 0, GROUPED: 1}
KV = {"cleanup.policy": "compact"}
WINDOWED = {"cleanup.policy": "compact,delete", "retention.ms": "86700000"}
VERSIONED_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "86460000"}


def topic(store: str) -> str:
    return f"{APP}-{store}-changelog"


# -- the topology description ---------------------------------------------------------------


def test_every_store_gets_its_subtopology_and_global_stores_are_apart() -> None:
    t = parse_topology(DESCRIBED)
    assert {n: s.subtopology for n, s in t.task_stores.items()} == TASK_STORES
    assert t.stores["global"].is_global and t.stores["global"].subtopology == 2
    assert (
        DESCRIBED.splitlines()[t.stores[GROUPED].line - 1].strip().startswith("Processor: KSTREAM-AGGREGATE")
    )


def test_a_store_named_by_two_processors_of_one_subtopology_is_one_store() -> None:
    text = DESCRIBED.replace("(stores: [counts])", "(stores: [counts, latest])")
    assert parse_topology(text).stores["latest"].subtopology == 0


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("", 1, "empty"),
        ("Sub-topology: 0\n", 1, "no 'Topologies:'"),
        ("Topologies:\n    Processor: P (stores: [a])\n", 2, "before any 'Sub-topology:'"),
        ("Topologies:\n   Sub-topology: 0\n    Procesor: P (stores: [a])\n", 3, "not a line"),
        (
            "Topologies:\n   Sub-topology: 0\n    Processor: P (stores: [a])\n"
            "  Sub-topology: 1\n    Processor: Q (stores: [a])\n",
            5,
            "in sub-topology 1 here but in 0 at line 3",
        ),
        ("Topologies:\n   Sub-topology: 0\n  Sub-topology: 0\n", 3, "named twice"),
    ],
    ids=["empty", "no-header", "node-first", "garbage", "two-subtopologies", "twice"],
)
def test_a_description_that_does_not_parse_names_the_line(
    text: str, line: int, what: str, tmp_path: Path
) -> None:
    path = tmp_path / "topology.txt"
    path.write_text(text)
    with pytest.raises(TopologyError, match=what) as e:
        read_topology(path)
    assert e.value.line == line and e.value.path == str(path)
    assert f"{path}:{line}:" in str(e.value)


# -- kinds from the changelog topics' configs -------------------------------------------------


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        (KV, KEY_VALUE),
        ({**KV, "min.compaction.lag.ms": "0"}, KEY_VALUE),
        (VERSIONED_CONFIG, VERSIONED),
        (WINDOWED, WINDOW_OR_SESSION),
        ({"cleanup.policy": "delete,compact"}, WINDOW_OR_SESSION),
        ({"cleanup.policy": "delete"}, None),
        ({}, None),
    ],
)
def test_the_changelog_configs_tell_the_kind(config: dict[str, str], kind: str | None) -> None:
    assert kind_from_topic_config(config) == kind


def test_discovery_writes_key_value_window_and_session_stores_and_reports_the_others() -> None:
    configs = {topic(n): KV for n in TASK_STORES}
    configs[topic("tumbling")] = configs[topic("sessions")] = WINDOWED
    configs[topic("latest")] = VERSIONED_CONFIG
    found = {
        f.name: f
        for f in discover_stores(
            parse_topology(DESCRIBED),
            APP,
            changelog_topics=set(configs),
            topic_configs=configs,
            formats={"counts": "timestamped", GROUPED: "timestamped", "tumbling": "timestamped-window"},
            retentions={"tumbling": 600_000},
        )
    }
    assert set(found) == set(TASK_STORES), "global stores are never restored"
    assert found[GROUPED].subtopology == 1 and found[GROUPED].refusal is None
    assert found["counts"].format == "timestamped" and found["counts"].refusal is None
    assert found["tumbling"].kind == WINDOW_OR_SESSION and found["tumbling"].refusal is None
    assert found["tumbling"].retention_ms == 600_000
    assert "give --store-format sessions=timestamped-window|window|session" in (
        found["sessions"].refusal or ""
    )
    # a versioned store, told by its changelog; its history retention is min.compaction.lag.ms less a day
    assert (found["latest"].kind, found["latest"].format, found["latest"].refusal) == (
        VERSIONED,
        "versioned",
        None,
    )
    assert found["latest"].retention_ms == 60_000


def test_a_kind_or_format_that_cannot_be_established_is_reported_never_guessed() -> None:
    topics = {topic(n) for n in TASK_STORES}
    configs = {t: KV for t in topics}
    found = {
        f.name: f
        for f in discover_stores(
            parse_topology(DESCRIBED), APP, changelog_topics=topics, topic_configs=configs
        )
    }
    assert all(f.refusal and "format is unknown" in f.refusal for f in found.values())
    bare = {f.name: f for f in discover_stores(parse_topology(DESCRIBED), APP, changelog_topics=topics)}
    assert all(f.kind is None and f.refusal and "kind is unknown" in f.refusal for f in bare.values())
    clash = discover_stores(
        parse_topology(DESCRIBED),
        APP,
        changelog_topics=topics,
        topic_configs={**configs, topic("counts"): WINDOWED},
        names={"counts": None},
        formats={"counts": "plain"},
    )
    assert clash[0].refusal is not None and "window or session" in clash[0].refusal


def test_a_store_without_a_changelog_or_in_another_subtopology_is_an_error_naming_the_line() -> None:
    t = parse_topology(DESCRIBED)
    line = t.stores[GROUPED].line
    with pytest.raises(TopologyError, match=f":{line}: store {GROUPED} has no changelog") as e:
        discover_stores(t, APP, changelog_topics={topic("counts")}, names={GROUPED: None})
    assert e.value.line == line
    with pytest.raises(TopologyError, match=f"store {GROUPED} is in sub-topology 1, not 0"):
        discover_stores(t, APP, changelog_topics={topic(GROUPED)}, names={GROUPED: 0})


def test_a_state_directory_that_disagrees_with_the_topology_is_an_error(tmp_path: Path) -> None:
    t = parse_topology(DESCRIBED)
    wrong = tmp_path / APP / "0_0" / "rocksdb" / GROUPED
    wrong.parent.mkdir(parents=True)
    _testing.store_write_batch(wrong, [(b"k", b"v")], {f"{topic(GROUPED)}-0": 0})
    with pytest.raises(TopologyError, match=r"is in sub-topology 1, but .*0_0.* is in task 0_0") as e:
        discover_stores(t, APP, changelog_topics={topic(GROUPED)}, state_dir=tmp_path)
    assert e.value.line == t.stores[GROUPED].line
    (tmp_path / APP / "0_0" / "rocksdb" / GROUPED).rename(tmp_path / APP / "0_0" / "rocksdb" / "stray")
    with pytest.raises(TopologyError, match=r"store stray .* is not in the topology"):
        discover_stores(t, APP, changelog_topics={topic(GROUPED)}, state_dir=tmp_path)


# -- the command line -------------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """Changelogs of two partitions for ``counts`` (sub-topology 0) and the grouped store (1)."""
    log = SegmentLog(tmp_path / "log")
    producer = log.producer("writer")
    producer.begin()
    for store in ("counts", GROUPED):
        for i in range(40):
            producer.send(topic(store), i % 2, b"k%d" % (i % 7), b"%d" % i)
    producer.commit()
    producer.close()
    log.close()
    (tmp_path / "topology.txt").write_text(DESCRIBED)
    return tmp_path


def test_restore_with_a_topology_puts_each_store_in_its_subtopology(app: Path) -> None:
    out = cli(
        *restore_args(
            app,
            APP,
            "--topology",
            str(app / "topology.txt"),
            "--store",
            "counts",
            "--store",
            GROUPED,
            "--store-format",
            "counts=timestamped",
            "--store-format",
            f"{GROUPED}=timestamped",
        )
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 ok, 0 failed, 0 stores not restored" in out.stdout
    for p in (0, 1):
        grouped = store_contents(app / "state" / APP / f"1_{p}" / "rocksdb" / GROUPED)
        assert len(grouped.data) > 0 and grouped.offsets == {f"{topic(GROUPED)}-{p}": 19}
        assert (app / "state" / APP / f"0_{p}" / "rocksdb" / "counts").is_dir()
    assert not (app / "state" / APP / "0_0" / "rocksdb" / GROUPED).exists()


def test_restore_reports_a_store_whose_format_is_unknown_and_restores_the_rest(app: Path) -> None:
    named = ["--store", "counts", "--store", GROUPED, "--store-format", "counts=plain"]
    out = cli(*restore_args(app, APP, "--topology", str(app / "topology.txt"), *named))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 ok, 0 failed, 1 stores not restored" in out.stdout
    assert f"not restored: store {GROUPED} (sub-topology 1): its kind is unknown" in out.stdout
    assert not (app / "state" / APP / "1_0").exists(), "never opened for writing"


def test_the_command_line_names_a_subtopology_without_a_topology_file(app: Path) -> None:
    out = cli(*restore_args(app, APP, "--store", f"{GROUPED}@1", "--store", "counts"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (app / "state" / APP / "1_1" / "rocksdb" / GROUPED).is_dir()
    assert (app / "state" / APP / "0_1" / "rocksdb" / "counts").is_dir()
    bad = cli(*restore_args(app, APP, "--store", "counts@x"))
    assert bad.returncode == 2 and "NAME@SUBTOPOLOGY" in bad.stderr


def test_a_bad_topology_or_a_disagreeing_state_directory_is_a_usage_error_naming_the_line(app: Path) -> None:
    bad = app / "bad.txt"
    bad.write_text(DESCRIBED.replace("Sink:", "Sunk:", 1))
    line = next(i for i, text in enumerate(DESCRIBED.splitlines(), start=1) if "Sink:" in text)
    out = cli(*restore_args(app, APP, "--topology", str(bad), "--store-format", "counts=plain"))
    assert out.returncode == 2 and f"{bad}:{line}:" in out.stderr, out.stderr
    assert cli(*restore_args(app, APP, "--store", f"{GROUPED}@0")).returncode == 0  # the old way: in task 0_p
    for command in ("inspect", "verify"):
        out = cli(
            command,
            "--state-dir",
            str(app / "state"),
            "--app-id",
            APP,
            "--log-dir",
            str(app / "log"),
            "--topology",
            str(app / "topology.txt"),
        )
        grouped_line = parse_topology(DESCRIBED).stores[GROUPED].line
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"topology.txt:{grouped_line}: store {GROUPED} is in sub-topology 1" in out.stderr


def test_retention_needs_a_topology_or_a_window_or_session_format(app: Path) -> None:
    out = cli(*restore_args(app, APP, "--retention", "tumbling=600000"))
    assert out.returncode == 2 and "--topology" in out.stderr
    assert "--store-format tumbling=window|timestamped-window|session" in out.stderr
