"""Kafka Streams 4.4, 4.2 and 3.9 start on a hopping-window count, stream-stream join stores and a
``groupBy`` count statestore pre-warmed from ``Topology.describe()``, and restore nothing.

The application (``interop/kafka-streams``, ``stores="more-windows"``: ``WindowTopologies.java``) has,
over one input topic whose timestamps march 250 ms a record from an hour ago:

* ``hcounts``: a hopping-window count (1-minute windows advancing by 20 s, no grace): a timestamped
  window store of retention 60 s;
* ``jn-this-join-store`` and ``jn-other-join-store``: the window stores of a stream-stream inner join
  (``JoinWindows`` of 60 s, no grace: retention 120 s, with duplicates), whose results ``jcounts``
  counts per key (a timestamped key-value store);
* a ``groupBy(...).count()``: its store in sub-topology 1 under the name the DSL generates.

Run to completion under exactly_once_v2; ``inspect`` and ``verify`` report every store of its own
state directory correctly; ``restore --topology`` (the description the application printed) rebuilds
them all into an empty directory, equal to Kafka Streams' own, in that version's layout (3.9 and 4.2:
``--kafka-streams-version``, the ``.checkpoint`` layout); Kafka Streams started there restores
nothing, and after more input its results equal those of an application that processed all the input.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import pytest

from statestore.state.topology import parse_topology
from support import kstreams_app
from support.cli import run_cli
from support.kstreams_checks import check_layout, check_own_state
from support.model import store_difference

pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 150
FIRST = kstreams_app.windowed_first_timestamp()
#: The stores the DSL gives a name to, with their format and retention (ms; None: a key-value store).
NAMED = {
    "hcounts": ("timestamped-window", 60_000),
    "jn-this-join-store": ("window", 120_000),
    "jn-other-join-store": ("window", 120_000),
    "jcounts": ("timestamped", None),
}


run_in = kstreams_app.windowed_runner("more-windows", KEYS, PARTITIONS, FIRST)


def databases(store: Path) -> list[Path]:
    """The RocksDBs of a store: itself, or its segments."""
    if (store / "CURRENT").exists():
        return [store]
    return sorted(p for p in store.iterdir() if p.is_dir())


@pytest.mark.parametrize("version", [kstreams_app.NEWEST, *kstreams_app.CHECKPOINT_LAYOUT_VERSIONS])
def test_kafka_streams_starts_on_hopping_join_and_grouped_stores_statestore_restored(
    kafka_bootstrap: str, tmp_path: Path, version: str
) -> None:
    kstreams_app.built(version)
    run = functools.partial(run_in, version=version)
    app = f"ksm{version.replace('.', '')}{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    ran = run(kafka_bootstrap, app, first, produce=3000)
    assert ran.closed_clean
    described = kstreams_app.described_topology(ran)
    (tmp_path / "topology.txt").write_text(described)
    topology = parse_topology(described)
    grouped = [n for n in topology.task_stores if n.startswith("KSTREAM-AGGREGATE-STATE-STORE-")]
    assert len(grouped) == 1 and topology.task_stores[grouped[0]].subtopology == 1, described
    stores = {**NAMED, grouped[0]: ("timestamped", None)}
    assert set(topology.task_stores) == set(stores), described
    subs = {name: s.subtopology for name, s in topology.task_stores.items()}

    # statestore reads what Kafka Streams wrote: every store, its segments, no lag, equal to its changelog
    check_own_state(kafka_bootstrap, first, app, stores, PARTITIONS, kstreams_app.layout_of(version), subs)

    # statestore rebuilds every store of the topology into an empty directory, as Kafka Streams holds them
    restored = tmp_path / "restored"
    out = run_cli(
        "restore",
        "--kafka",
        kafka_bootstrap,
        "--state-dir",
        str(restored),
        "--app-id",
        app,
        "--topology",
        str(tmp_path / "topology.txt"),
        *kstreams_app.version_flags(version),
        *kstreams_app.store_flags(stores),
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(stores) * PARTITIONS} ok, 0 failed, 0 stores not restored" in out.stdout, out.stdout
    for name, (_fmt, retention) in stores.items():
        for p in range(PARTITIONS):
            task = f"{subs[name]}_{p}"
            where = Path(task) / name if retention is not None else Path(task) / "rocksdb" / name
            theirs, ours = databases(first / app / where), databases(restored / app / where)
            assert theirs and [d.name for d in ours] == [d.name for d in theirs], (name, p, ours, theirs)
            for t, o in zip(theirs, ours, strict=True):
                assert store_difference(t, o) is None, (name, p, t.name)
    check_layout(first, restored, app, version)

    # Kafka Streams restores nothing there, and after 1,000 more records its results equal those of an
    # application that processed all 4,000 from scratch
    ref = kstreams_app.check_more_input(
        functools.partial(run, kafka_bootstrap), app, restored, tmp_path / "ref", produced=3000
    )
    assert ref.stores.keys() == {"hcounts", "jcounts", grouped[0]}, ref.stores
    assert all(int(s["entries"]) > 0 for s in ref.stores.values()), ref.stores
