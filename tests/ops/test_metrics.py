"""Restore and standby metrics: the recorder, the task manager's feed, the Prometheus exporter, the live view.

The exporter is scraped over HTTP while a real restore is paused inside its
progress callback, so what is scraped is a restore in flight, not a finished one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from statestore import RestoreMetrics, SegmentLog, TaskId, TaskManager, TopicPartition, restore_store
from statestore.ops.metrics import METRICS_DIR_NAME, MetricsPublisher, MetricsSnapshot, published_snapshots

APP = "metrics-app"
STORE = "counts"
TOPIC = f"{APP}-{STORE}-changelog"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def write_log(
    log_dir: Path, partitions: int, records: int, *, abort_every: int = 0, value_bytes: int = 8
) -> SegmentLog:
    log = SegmentLog(log_dir)
    p = log.producer("writer")
    for part in range(partitions):
        for start in range(0, records, 5_000):
            p.begin()
            p.send_many(
                TOPIC,
                part,
                [
                    (b"k%06d" % (i % 20_000), b"%-*d" % (value_bytes, i))
                    for i in range(start, min(records, start + 5_000))
                ],
            )
            if abort_every and (start // 5_000) % abort_every == abort_every - 1:
                p.abort()
            else:
                p.commit()
    p.close()
    return log


# -- the recorder ----------------------------------------------------------------------------


def test_rate_remaining_and_eta_follow_the_progress() -> None:
    clock = Clock()
    m = RestoreMetrics(APP, clock=clock)
    tp = TopicPartition(TOPIC, 3)
    m.restore_started(TaskId(0, 3), tp, STORE, 0, 10_000)
    clock.t += 1
    m.restored(TaskId(0, 3), tp, STORE, 2_000, 2_000)
    clock.t += 1
    m.restored(TaskId(0, 3), tp, STORE, 2_000, 4_000)
    (s,) = m.snapshot().stores
    assert (s.task_id, s.store, s.changelog, s.kind) == ("0_3", STORE, str(tp), "active")
    assert s.records_restored == 4_000
    assert s.rate == pytest.approx(2_000)
    assert s.remaining_records == 6_000
    assert s.eta_seconds() == pytest.approx(3.0)
    assert s.seconds == pytest.approx(2.0) and not s.done
    clock.t += 10
    m.restore_ended(TaskId(0, 3), STORE)
    (s,) = m.snapshot().stores
    assert s.done and s.remaining_records == 0 and s.eta_seconds() == 0.0
    assert s.seconds == pytest.approx(12.0)
    m.forget(TaskId(0, 3))
    assert m.snapshot().stores == []


def test_standby_lag_is_the_distance_to_the_changelog_end() -> None:
    clock = Clock()
    m = RestoreMetrics(APP, clock=clock)
    tp = TopicPartition(TOPIC, 0)
    m.standby_updated("0_0", tp, STORE, 500, 500, 800)
    clock.t += 0.5
    m.standby_updated("0_0", tp, STORE, 300, 800, 900)
    (s,) = m.snapshot().stores
    assert s.kind == "standby" and s.records_restored == 800
    assert s.remaining_records == 100
    assert s.rate == pytest.approx(600)


def test_a_snapshot_round_trips_through_json() -> None:
    m = RestoreMetrics(APP)
    m.restore_started("0_1", TopicPartition(TOPIC, 1), STORE, 5, 50)
    m.tasks_by_state = lambda: {"active RESTORING": 1}
    snap = m.snapshot()
    assert MetricsSnapshot.from_json(snap.to_json()) == snap
    with pytest.raises(ValueError):
        MetricsSnapshot.from_json('{"pid": 1}')


# -- fed by a real restore -------------------------------------------------------------------


def test_a_real_restore_ends_with_what_it_applied(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 1, 30_000, abort_every=3)
    m = RestoreMetrics(APP)
    result = restore_store(
        tmp_path / STORE,
        log,
        TopicPartition(TOPIC, 0),
        mode="replay",
        listener=m.listener("0_0"),
        progress_interval=0.0,
    )
    (s,) = m.snapshot().stores
    assert s.records_restored == result.records_applied == 20_000
    assert s.done and s.remaining_records == 0 and s.position == result.end_offset


def test_the_task_manager_feeds_restores_tasks_by_state_and_lag(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 2, 20_000, abort_every=4)
    m = RestoreMetrics(APP)
    tm = TaskManager(
        tmp_path / "state", log, [STORE], guarantee="exactly_once_v2", application_id=APP, metrics=m
    )
    tm.start()
    tm.assign([TaskId(0, 0)], [TaskId(0, 1)])
    assert m.snapshot().tasks_by_state == {"active RESTORING": 1, "standby RUNNING": 1}
    assert tm.restore()
    tm.poll(0)
    snap = m.snapshot()
    assert snap.tasks_by_state == {"active RUNNING": 1, "standby RUNNING": 1}
    by_task = {s.task_id: s for s in snap.stores}
    assert by_task["0_0"].kind == "active" and by_task["0_0"].done
    assert by_task["0_0"].records_restored == 15_000
    lag = tm.lag()
    assert lag[TaskId(0, 0)][STORE].records == 0
    assert lag[TaskId(0, 0)][STORE].offsets >= 0
    tm.close()


# -- the Prometheus exporter -----------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("statestore_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class PauseOnce:
    """A listener that stops the restoring thread at its first batch until the test let it go."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        pass

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        if not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60)

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        pass


def test_the_exporter_is_scraped_during_a_real_restore(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from statestore.ops.exporter import start_exporter

    # ~25 MiB of log: with a 12 MiB memory budget a replay batch covers 4 MiB, so there are several
    log = write_log(tmp_path / "log", 1, 200_000, value_bytes=100)
    m = RestoreMetrics(APP)
    port, _ = start_exporter(m)
    pause = PauseOnce()
    out: dict[str, object] = {}

    def run() -> None:
        out["result"] = restore_store(
            tmp_path / STORE,
            log,
            TopicPartition(TOPIC, 0),
            mode="replay",
            listener=m.listener(TaskId(0, 0), also=pause),
            progress_interval=0.0,
            memory_budget_bytes=12 << 20,
        )

    t = threading.Thread(target=run)
    t.start()
    while not pause.reached.wait(0.1):
        assert t.is_alive(), f"the restore ended without reporting progress: {out}"
    labels = f'{{application_id="{APP}",store="{STORE}",task="0_0"}}'
    during = scrape(port)
    pause.go.set()
    t.join(120)
    after = scrape(port)
    result = out["result"]
    assert 0 < during[f"statestore_restore_records_total{labels}"] < 200_000
    assert during[f"statestore_restore_remaining_records{labels}"] > 0
    assert after[f"statestore_restore_records_total{labels}"] == result.records_applied == 200_000  # type: ignore[attr-defined]
    assert after[f"statestore_restore_remaining_records{labels}"] == 0
    assert after[f"statestore_restore_seconds{labels}"] > 0
    assert re.search(r"statestore_restore_records_per_second", "\n".join(after))


# -- the live view ---------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_watch_shows_a_published_restore_and_survives_a_wiped_task(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 2, 10_000, abort_every=2)
    state = tmp_path / "state"
    for part in range(2):
        store = state / APP / f"0_{part}" / "rocksdb" / STORE
        store.parent.mkdir(parents=True)
        restore_store(store, log, TopicPartition(TOPIC, part), end_offset=2_000)
    clock = Clock()
    m = RestoreMetrics(APP, clock=clock)
    m.restore_started("0_0", TopicPartition(TOPIC, 0), STORE, 2_001, 10_002)
    clock.t += 2
    m.restored("0_0", TopicPartition(TOPIC, 0), STORE, 4_000, 6_001)
    args = [
        "watch",
        "--state-dir",
        str(state),
        "--app-id",
        APP,
        "--log-dir",
        str(tmp_path / "log"),
        "--interval",
        "0.2",
        "--iterations",
        "2",
    ]
    with MetricsPublisher(m, state) as pub:
        assert pub.path.parent.name == METRICS_DIR_NAME
        assert [s.pid for s in published_snapshots(state, APP)] == [os.getpid()]
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
        assert "2,000" in out.stdout  # the publisher's rate, records/s
        assert "2s" in out.stdout  # 4,001 offsets left at 2,000/s
        # a task directory removed and a snapshot file of garbage: still a table
        import shutil

        shutil.rmtree(state / APP / "0_1")
        (state / APP / METRICS_DIR_NAME / "999999.json").write_text("not json")
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
        assert "0_1" not in out.stdout and "0_0" in out.stdout
    assert not pub.path.exists()


def test_watch_says_unknown_for_a_store_it_cannot_read(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 1, 5_000)
    store = tmp_path / "state" / APP / "0_0" / "rocksdb" / STORE
    store.parent.mkdir(parents=True)
    restore_store(store, log, TopicPartition(TOPIC, 0))
    (store / "CURRENT").write_text("garbage\n")
    out = run_cli(
        "watch",
        "--state-dir",
        str(tmp_path / "state"),
        "--app-id",
        APP,
        "--log-dir",
        str(tmp_path / "log"),
        "--iterations",
        "1",
    )
    assert out.returncode == 0, out.stderr
    assert "unknown" in out.stdout
    out = run_cli(
        "inspect",
        "--state-dir",
        str(tmp_path / "state"),
        "--app-id",
        APP,
        "--log-dir",
        str(tmp_path / "log"),
        "--json",
    )
    (row,) = json.loads(out.stdout)["stores"]
    assert row["lag"] is None and row["problem"]


def test_a_restore_too_short_to_report_progress_still_counts(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 1, 2_000)
    m = RestoreMetrics(APP)
    result = restore_store(
        tmp_path / STORE, log, TopicPartition(TOPIC, 0), listener=m.listener("0_0"), progress_interval=3600.0
    )
    (s,) = m.snapshot().stores
    assert s.records_restored == result.records_applied == 2_000 and s.done


# -- standby promotions, task states, liveness (what statestore.app publishes) ------------------


def app_like_metrics() -> RestoreMetrics:
    m = RestoreMetrics(APP)
    m.task_states = lambda: {"0_0": "RUNNING", "0_1": "RESTORING", "0_2": "STANDBY"}
    m.liveness = lambda: {"state": "RUNNING", "last_poll_at": 1_000.0, "instance_id": None}
    m.tasks_by_state = lambda: {"active RUNNING": 1, "active RESTORING": 1, "standby RUNNING": 1}
    # two tasks moved in and found a standby, one did not; the hits replayed 7 records, the miss 500
    m.promoted("0_0", True)
    m.promoted("0_1", True)
    m.promoted("0_3", False)
    m.restore_started("0_0", TopicPartition(TOPIC, 0), STORE, 10, 17)
    m.restored("0_0", TopicPartition(TOPIC, 0), STORE, 7, 17)
    m.restore_ended("0_0", STORE, 7)
    m.promotion_replayed("0_0", True, m.active_restored("0_0"))
    m.promotion_replayed("0_3", False, 500)
    return m


def test_standby_promotions_task_states_and_liveness_are_in_the_snapshot() -> None:
    snap = app_like_metrics().snapshot()
    assert snap.standby_promotions == {"hit": 2, "miss": 1}
    assert snap.hit_rate() == pytest.approx(2 / 3)
    assert snap.promotion_replayed_records == {"hit": 7, "miss": 500}
    assert snap.task_states == {"0_0": "RUNNING", "0_1": "RESTORING", "0_2": "STANDBY"}
    assert snap.liveness["state"] == "RUNNING"
    assert MetricsSnapshot.from_json(snap.to_json()) == snap
    # a snapshot of an older writer (no such fields) still reads
    old = json.loads(snap.to_json())
    for k in ("task_states", "standby_promotions", "promotion_replayed_records", "liveness"):
        del old[k]
    back = MetricsSnapshot.from_json(json.dumps(old))
    assert back.task_states == {} and back.hit_rate() is None and back.liveness == {}


def test_the_exporter_serves_promotions_task_states_and_liveness() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from statestore.ops.exporter import register

    reg = CollectorRegistry()
    register(app_like_metrics(), reg)
    text = generate_latest(reg).decode()
    assert f'statestore_standby_promotions_total{{application_id="{APP}",result="hit"}} 2.0' in text
    assert f'statestore_standby_promotions_total{{application_id="{APP}",result="miss"}} 1.0' in text
    assert f'statestore_promotion_replayed_records_total{{application_id="{APP}",result="hit"}} 7.0' in text
    assert (
        f'statestore_promotion_replayed_records_total{{application_id="{APP}",result="miss"}} 500.0' in text
    )
    for task, state in (("0_0", "RUNNING"), ("0_1", "RESTORING"), ("0_2", "STANDBY")):
        assert f'statestore_task_state{{application_id="{APP}",state="{state}",task="{task}"}} 1.0' in text
    assert re.search(
        rf'statestore_app_last_poll_age_seconds\{{application_id="{APP}",state="RUNNING"\}} \d', text
    )


def test_watch_and_inspect_show_published_task_states_and_liveness(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log", 3, 1_000)
    state = tmp_path / "state"
    for part in range(3):
        store = state / APP / f"0_{part}" / "rocksdb" / STORE
        store.parent.mkdir(parents=True)
        restore_store(store, log, TopicPartition(TOPIC, part))
    m = app_like_metrics()
    m.liveness = lambda: {"state": "RUNNING", "last_poll_at": time.time(), "instance_id": None}
    common = ["--state-dir", str(state), "--app-id", APP]
    with MetricsPublisher(m, state):
        out = run_cli("watch", *common, "--iterations", "1")
        assert out.returncode == 0, out.stderr
        for task, st in (("0_0", "RUNNING"), ("0_1", "RESTORING"), ("0_2", "STANDBY")):
            assert re.search(rf"{task} .*{st}", out.stdout), out.stdout
        assert f"live: pid {os.getpid()}; RUNNING; last poll" in out.stdout
        assert "standby hits 2/3 (67%), 507 records replayed on promotion" in out.stdout
        out = run_cli("inspect", *common, "--quick", "--json")
        assert out.returncode == 0, out.stderr
        (proc,) = json.loads(out.stdout)["processes"]
        assert proc["pid"] == os.getpid() and proc["task_states"]["0_2"] == "STANDBY"
        assert proc["standby_promotions"] == {"hit": 2, "miss": 1}
    out = run_cli("inspect", *common, "--quick")
    assert out.returncode == 0, out.stderr
    assert "live:" not in out.stdout and "RUNNING" not in out.stdout  # closed: no live process
