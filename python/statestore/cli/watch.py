"""``statestore watch``: the inspect table, refreshed, with restore rates and time to completion."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.cli.common import console, kafka_changelog, kafka_options, log_dir_option, state_options
from statestore.errors import StateStoreError
from statestore.ops.inspection import StoreReport, inspect_app
from statestore.ops.metrics import (
    MetricsSnapshot,
    StoreMetrics,
    describe_liveness,
    published_snapshots,
    task_states_by_process,
)

UNKNOWN = "unknown"


@dataclass(frozen=True)
class WatchRow:
    """One store in the live view: what inspect reads, plus what a live process publishes about it."""

    report: StoreReport
    live: StoreMetrics | None
    lag_rate: float | None
    """Records per second the lag shrank by since the previous refresh (None on the first)."""
    task_state: str | None = None
    """``RESTORING``/``RUNNING``/``STANDBY`` as the live process running the task publishes it."""

    def rate(self) -> float | None:
        """Restore (or standby update) rate: the publishing process's, else the lag's shrink rate."""
        if self.live is not None:
            return self.live.rate
        return self.lag_rate

    def eta(self) -> float | None:
        """Seconds to completion at the current rate; None when unknown."""
        if self.live is not None:
            return self.live.eta_seconds()
        if self.report.lag == 0:
            return 0.0
        if self.report.lag is None or not self.lag_rate or self.lag_rate <= 0:
            return None
        return self.report.lag / self.lag_rate


def _live_by_store(snaps: list[MetricsSnapshot]) -> dict[tuple[str, str], StoreMetrics]:
    out: dict[tuple[str, str], StoreMetrics] = {}
    for snap in snaps:
        for s in snap.stores:
            out[(s.task_id, s.store)] = s
    return out


def watch_rows(
    state_dir: Path,
    app_id: str,
    log: Changelog | None,
    previous: dict[tuple[str, str], tuple[float, int]] | None,
) -> tuple[int | None, list[WatchRow], dict[tuple[str, str], tuple[float, int]]]:
    """One refresh: the process-lock holder, one row per store, and the lag samples for the next refresh.

    Reads only what is safe without taking a lock: stores opened read-only,
    lock holders from ``/proc/locks``, snapshots published by live processes.
    A store wiped or a task directory removed between two refreshes just drops
    out; a file that cannot be read shows ``unknown``.
    """
    holder, reports = inspect_app(state_dir, app_id, changelog=log)
    snaps = published_snapshots(state_dir, app_id)
    live = _live_by_store(snaps)
    states = task_states_by_process(snaps)
    now = time.monotonic()
    samples: dict[tuple[str, str], tuple[float, int]] = {}
    rows = []
    for r in reports:
        key = (r.task_id, r.store)
        lag_rate = None
        if r.lag is not None:
            samples[key] = (now, r.lag)
            if previous is not None and key in previous:
                t0, lag0 = previous[key]
                if now > t0:
                    lag_rate = max(0.0, (lag0 - r.lag) / (now - t0))
        state = states.get(r.task_id)
        rows.append(WatchRow(r, live.get(key), lag_rate, None if state is None else state[0]))
    return holder, rows, samples


def _num(v: int | None) -> str:
    return UNKNOWN if v is None else f"{v:,}"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return UNKNOWN
    if seconds == 0:
        return "done"
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def render(
    app_id: str,
    holder: int | None,
    rows: list[WatchRow],
    with_log: bool,
    live: list[MetricsSnapshot] | None = None,
) -> Table:
    """The live table of one refresh; ``live``: the snapshots of live processes, one caption line each."""
    table = Table(
        title=f"{app_id}  (process lock: {'pid ' + str(holder) if holder else 'free'})  "
        f"{time.strftime('%H:%M:%S')}",
        title_justify="left",
        caption="\n".join(f"live: {describe_liveness(s)}" for s in live or []) or None,
        caption_justify="left",
    )
    for col, right in [
        ("task", False),
        ("store", False),
        ("status", False),
        ("task state", False),
        ("store offset", True),
        ("restoring", False),
        ("restored", True),
        ("rate/s", True),
        ("remaining", True),
        ("eta", True),
    ]:
        table.add_column(col, justify="right" if right else "left")
    if with_log:
        table.add_column("lag (records)", justify="right")
        table.add_column("lag (offsets)", justify="right")
    for w in rows:
        r = w.report
        rate = w.rate()
        cells = [
            r.task_id,
            r.store,
            r.status if r.problem is None else f"[red]{r.problem}[/red]",
            w.task_state or "-",
            "-" if r.store_offset is None else f"{r.store_offset:,}",
            "-" if w.live is None else "done" if w.live.done else w.live.kind,
            "-" if w.live is None else f"{w.live.records_restored:,}",
            UNKNOWN if rate is None else f"{rate:,.0f}",
            "-" if w.live is None else _num(w.live.remaining_records),
            _eta(w.eta()),
        ]
        if with_log:
            cells += [_num(r.lag), _num(r.offset_lag)]
        table.add_row(*cells)
    return table


@click.command()
@state_options
@log_dir_option(required=False)
@kafka_options
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many refreshes (default: until Ctrl-C).",
)
def watch(
    state_dir: Path,
    app_id: str,
    log_dir: Path | None,
    kafka: str | None,
    kafka_config: tuple[str, ...],
    interval: float,
    iterations: int | None,
) -> None:
    """Refresh the inspect table with restore rates and time to completion, while restores run elsewhere.

    Rates and remaining records come from the snapshots that restoring
    processes publish (``statestore restore`` does; an application does with
    ``MetricsPublisher``); otherwise from how fast each store's lag shrinks.
    Reads only, without taking any lock.

    \b
    Example:
      statestore watch --state-dir /var/lib/app/state --app-id counts --log-dir /var/lib/app/log
    """
    if log_dir is not None and kafka is not None:
        raise click.UsageError("give either --log-dir or --kafka, not both")
    if kafka is not None:
        with kafka_changelog(kafka, kafka_config) as changelog:
            _loop(state_dir, app_id, changelog, interval, iterations)
    else:
        _loop(state_dir, app_id, SegmentLog(log_dir) if log_dir is not None else None, interval, iterations)


def _loop(
    state_dir: Path, app_id: str, log: Changelog | None, interval: float, iterations: int | None
) -> None:
    previous: dict[tuple[str, str], tuple[float, int]] | None = None
    out = console if sys.stdout.isatty() else Console(width=200)
    n = 0

    def frame() -> Group | Table:
        nonlocal previous
        try:
            holder, rows, previous = watch_rows(state_dir, app_id, log, previous)
        except StateStoreError as e:
            return Group(Text(f"{time.strftime('%H:%M:%S')} {e}", style="red"))
        return render(app_id, holder, rows, log is not None, published_snapshots(state_dir, app_id))

    if not out.is_terminal:
        # Not a terminal (a pipe, a test): print each refresh in turn.
        while iterations is None or n < iterations:
            out.print(frame())
            n += 1
            if iterations is None or n < iterations:
                time.sleep(interval)
        return
    with Live(frame(), console=out, refresh_per_second=4) as live:
        n = 1
        try:
            while iterations is None or n < iterations:
                time.sleep(interval)
                live.update(frame())
                n += 1
        except KeyboardInterrupt:
            pass
