"""Kafka Streams 3.9 and 4.2 and the ``.checkpoint`` layout, on one real broker.

The application of ``interop/kafka-streams`` is built once more against
Kafka Streams 3.9.0 (rocksdbjni 7.9.2, which reads table ``format_version``
5 at most) and 4.2.0 (the newest version that keeps offsets in the task's
``.checkpoint``), each cached outside the clone like the 4.4 build. It runs
to its end under exactly_once_v2; then

* statestore reads its state directory, written by that Kafka Streams itself:
  ``inspect`` finds every store's offset in the ``.checkpoint`` file and no
  lag, ``verify`` finds every store equal to its changelog;
* ``restore --kafka-streams-version 3.9`` (or 4.2) rebuilds both stores into an empty
  directory, the application starts there and restores nothing, and its
  results on new input are exact.

The same for the windowed application (a tumbling windowed count and a
session-windowed count): window and session stores in the ``.checkpoint``
layout, segment by segment.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from support import kstreams_app
from support.cli import run_cli
from support.kstreams_checks import check_layout, check_own_state
from support.model import store_contents

kafka = pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 150
VALUE_SIZE = 40


@pytest.fixture(scope="module", params=kstreams_app.CHECKPOINT_LAYOUT_VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    """A Kafka Streams version of the ``.checkpoint`` layout, the application built against it."""
    kstreams_app.built(request.param)
    return str(request.param)


def run_app(version: str, bootstrap: str, app: str, state: Path, **kw: object) -> kstreams_app.AppRun:
    """One run of the key-value application built against ``version``."""
    config = {"commit.interval.ms": "500", **kw.pop("config", {})}  # type: ignore[dict-item]
    return kstreams_app.run_app(
        bootstrap,
        app,
        state,
        version,
        keys=KEYS,
        value_size=VALUE_SIZE,
        partitions=PARTITIONS,
        guarantee="exactly_once_v2",
        config=config,
        **kw,
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


def check_results(run: kstreams_app.AppRun, total: int) -> None:
    latest, counts = kstreams_app.expected(total, KEYS, VALUE_SIZE)
    assert run.results["latest"] == latest
    assert {k: int(v) for k, v in run.results["counts"].items()} == counts


def test_kafka_streams_3_9_and_4_2_start_on_the_checkpoint_layout(
    version: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    app = f"ks{version.replace('.', '')}{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    run = run_app(version, kafka_bootstrap, app, first, mode="process", produce=4000, print_results=True)
    assert run.closed_clean
    check_results(run, 4000)

    # statestore reads what that Kafka Streams wrote: offsets in .checkpoint, stores without an offsets family
    kafka_args = ["--kafka", kafka_bootstrap, "--state-dir"]
    out = cli("inspect", *kafka_args, str(first), "--app-id", app, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    stores = json.loads(out.stdout)["stores"]
    assert len(stores) == 2 * PARTITIONS
    for s in stores:
        assert s["layout"] == "checkpoint" and s["store_offset"] is None and s["problem"] is None, s
        assert s["checkpoint_offset"] is not None and s["lag"] == 0, s
    out = cli("verify", *kafka_args, str(first), "--app-id", app)
    assert out.returncode == 0 and out.stdout.count("exact") == 2 * PARTITIONS, out.stdout + out.stderr

    # statestore restores for that version into an empty directory; the same data and offsets as Kafka Streams' own
    restored = tmp_path / "restored"
    formats = [
        a for name, fmt in kstreams_app.STORE_FORMATS.items() for a in ("--store-format", f"{name}={fmt}")
    ]
    out = cli(
        "restore",
        *kafka_args,
        str(restored),
        "--app-id",
        app,
        *kstreams_app.version_flags(version),
        *formats,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # the .checkpoint layout, each task's .checkpoint with Kafka Streams' entries (it writes them in its
    # HashMap's order, statestore sorted)
    check_layout(first, restored, app, version)
    for p in range(PARTITIONS):
        task = f"0_{p}"
        for name in kstreams_app.STORE_FORMATS:
            ours, theirs = restored / app / task / "rocksdb" / name, first / app / task / "rocksdb" / name
            assert store_contents(ours).data == store_contents(theirs).data

    # that Kafka Streams starts on it: nothing to restore, then exact results on new input
    more = run_app(version, kafka_bootstrap, app, restored, mode="process", produce=1000, print_results=True)
    assert more.restored_records == 0, more.restores
    check_results(more, 5000)


def test_kafka_streams_3_9_and_4_2_start_on_window_and_session_stores_in_the_checkpoint_layout(
    version: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The windowed application (a tumbling windowed count, a session-windowed count) on that version:
    inspect and verify read its own segments and .checkpoint; statestore restores both stores for that
    version into an empty directory (segments without the offsets family, format_version 5, offsets in
    the task's .checkpoint), and that Kafka Streams starts there, restores nothing, and its windows and
    sessions after new input equal those of an application that processed all the input."""
    app = f"kw{version.replace('.', '')}{uuid.uuid4().hex[:8]}"
    stores = kstreams_app.WINDOWED_STORES
    windowed: dict[str, object] = {
        "stores": "windowed",
        "time_step_ms": kstreams_app.WINDOWED_STEP_MS,
        "first_timestamp_ms": kstreams_app.windowed_first_timestamp(),
        "config": kstreams_app.WINDOWED_CONFIG,
    }
    first = tmp_path / "first"
    ran = run_app(version, kafka_bootstrap, app, first, mode="process", produce=3000, **windowed)
    assert ran.closed_clean
    check_own_state(kafka_bootstrap, first, app, stores, PARTITIONS, "checkpoint")

    restored = tmp_path / "restored"
    kstreams_app.restore_with_cli(kafka_bootstrap, app, restored, stores, version)
    check_layout(first, restored, app, version)
    for task in (f"0_{p}" for p in range(PARTITIONS)):
        for name in stores:
            theirs, ours = first / app / task / name, restored / app / task / name
            names = sorted(p.name for p in theirs.iterdir() if p.is_dir())
            assert names and sorted(p.name for p in ours.iterdir()) == names, (task, name)
            for seg in names:
                assert store_contents(ours / seg).data == store_contents(theirs / seg).data, (task, seg)

    more = run_app(
        version, kafka_bootstrap, app, restored, mode="process", produce=1000, print_results=True, **windowed
    )
    assert more.restored_records == 0, more.restores
    ref = run_app(
        version,
        kafka_bootstrap,
        f"{app}ref",
        tmp_path / "ref",
        mode="process",
        input_topic=f"{app}-input",
        expect=4000,
        print_results=True,
        **windowed,
    )
    assert int(ref.stores["wcounts"]["entries"]) > 0 and int(ref.stores["scounts"]["entries"]) > 0
    assert more.results == ref.results and more.stores == ref.stores
