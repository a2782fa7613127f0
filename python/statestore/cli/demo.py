"""``statestore demo``: the whole story on the embedded changelog, in under a minute."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from statestore.demo import DEMO_APP, DEMO_STORE, build_changelog, restore_partitions
from statestore.ids import TopicPartition, changelog_topic
from statestore.log import SegmentLog
from statestore.restore import RestoreListener, RestoreResult
from statestore.verify import verify_app


class RateColumn(ProgressColumn):
    """Offsets restored per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:>12,.0f} rec/s", style="cyan")


class _BarListener:
    """A RestoreListener that moves one progress bar (called from restoring threads)."""

    def __init__(self, progress: Progress, tp: TopicPartition) -> None:
        self.progress = progress
        self.task = progress.add_task(f"partition {tp.partition}", total=None, start=False)
        self.start = 0

    def on_restore_start(self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int) -> None:
        self.start = start_offset
        self.progress.update(self.task, total=max(0, end_offset - start_offset))
        self.progress.start_task(self.task)

    def on_batch_restored(self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int) -> None:
        self.progress.update(self.task, completed=batch_end_offset - self.start)

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        total = self.progress.tasks[self.task].total or 0
        self.progress.update(self.task, completed=total)


def _summary(results: list[RestoreResult]) -> Table:
    table = Table(title="restore summary")
    for col in ("partition", "mode", "records applied", "skipped", "MiB read", "seconds", "records/s"):
        table.add_column(col, justify="left" if col in ("partition", "mode") else "right")
    for r in results:
        if r.error is not None:
            table.add_row(str(r.tp.partition), r.mode, "-", "-", "-", "-", f"[red]{r.error}[/red]")
            continue
        rate = r.records_applied / r.seconds if r.seconds > 0 else 0.0
        table.add_row(
            str(r.tp.partition),
            r.mode,
            f"{r.records_applied:,}",
            f"{r.records_skipped.total:,}",
            f"{r.bytes_read / 2**20:,.1f}",
            f"{r.seconds:.2f}",
            f"{rate:,.0f}",
        )
    return table


@click.command()
@click.option("--dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to leave the demo's files (default: a new temporary directory).")
@click.option("--records", type=click.IntRange(1000), default=2_000_000, show_default=True,
              help="Changelog records in total.")
@click.option("--partitions", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=None, help="Restore threads (default: one per core).")
def demo(out_dir: Path | None, records: int, partitions: int, threads: int | None) -> None:
    """Build a realistic changelog, restore every partition in parallel, and verify the result.

    The changelog has overwrites, tombstones and aborted transactions; restoring
    skips aborted data and markers and keeps the last value of every key.

    \b
    Example:
      statestore demo --records 200000 --dir /tmp/statestore-demo
    """
    console = Console()
    root = out_dir or Path(tempfile.mkdtemp(prefix="statestore-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    log_dir, state_dir = root / "log", root / "state"
    topic = changelog_topic(DEMO_APP, DEMO_STORE)
    log = SegmentLog(log_dir, sync=False)

    console.rule("[bold]1. a changelog")
    t0 = time.perf_counter()
    with Progress(TextColumn("writing"), BarColumn(), MofNCompleteColumn(), console=console, transient=True) as bar:
        task = bar.add_task("partitions", total=partitions)
        stats = build_changelog(log, topic, partitions, records, on_partition=lambda _p: bar.advance(task))
    console.print(
        f"{stats.records:,} records in {partitions} partitions of [bold]{topic}[/bold] "
        f"({stats.committed:,} committed, {stats.aborted:,} in aborted transactions, "
        f"{stats.tombstones:,} tombstones, ~{stats.keys:,} keys) in {time.perf_counter() - t0:.1f}s"
    )

    console.rule("[bold]2. restore every partition in parallel")
    threads = threads or os.cpu_count() or 1
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(), TimeRemainingColumn(),
        console=console,
    ) as progress:
        listeners: dict[TopicPartition, RestoreListener] = {}

        def listener_for(tp: TopicPartition) -> RestoreListener:
            listeners[tp] = _BarListener(progress, tp)
            return listeners[tp]

        t0 = time.perf_counter()
        results = restore_partitions(log, state_dir, range(partitions), threads=threads, listener_for=listener_for)
        wall = time.perf_counter() - t0
    console.print(_summary(results))
    applied = sum(r.records_applied for r in results)
    console.print(f"{applied:,} records restored in {wall:.2f}s on {threads} threads ({applied / wall:,.0f} records/s)")
    if any(r.error for r in results):
        raise click.ClickException("some partitions failed to restore (see the table)")

    console.rule("[bold]3. verify")
    verdicts = verify_app(state_dir, DEMO_APP, log_dir)
    exact = sum(v.ok for v in verdicts)
    console.print(f"{exact} of {len(verdicts)} stores equal the committed changelog exactly")
    if exact != len(verdicts):
        raise click.ClickException("verify found a store that differs from its changelog")

    console.rule("[bold]explore")
    console.print(f"Files left in [bold]{root}[/bold]. Try:")
    console.print(f"  statestore inspect --state-dir {state_dir} --app-id {DEMO_APP} --log-dir {log_dir}")
    console.print(f"  statestore verify --state-dir {state_dir} --app-id {DEMO_APP} --log-dir {log_dir}")
    console.print(f"  statestore log dump {log_dir} --partition {topic}-0")
