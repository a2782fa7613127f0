"""``statestore demo``: the whole story on the embedded changelog, in under a minute."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from statestore import _native
from statestore.changelog.segment_log import SegmentLog
from statestore.cli.common import BarListener, restore_progress
from statestore.cli.demos.counter import APP as CounterApp
from statestore.cli.demos.counter import POS_KEY, expected_counts
from statestore.cli.demos.profiles import DEMO_APP, DEMO_STORE, build_changelog, restore_partitions
from statestore.ids import TopicPartition, changelog_topic
from statestore.ops.verify import verify_app
from statestore.restore.engine import RestoreListener, RestoreResult


def _crash_and_recover(root: Path, records: int, console: Console) -> bool:
    """Run the counting processor, SIGKILL it mid-transaction, restart it, check the counts."""
    root.mkdir(parents=True, exist_ok=True)
    commit_every = max(1000, records // 20)
    cmd = [sys.executable, "-m", "statestore.cli.demos.counter", str(root), str(records), str(commit_every)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    committed = 0
    for line in child.stdout:
        if line.startswith("committed"):
            committed = int(line.split()[1])
            if committed >= records // 2:
                break
    time.sleep(random.uniform(0.005, 0.03))  # somewhere inside the next transaction
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    log = SegmentLog(root / "log", sync=False)
    tp = TopicPartition(changelog_topic(CounterApp, "counts"), 0)
    start, end, lso = log.offsets(tp)
    open_txn = (
        f"last stable offset {lso:,}: the killed transaction is still open in the log"
        if lso < end
        else "the killed transaction's records had not reached the log yet"
    )
    console.print(
        f"killed with SIGKILL after committing input position {committed:,}; the changelog holds offsets "
        f"{start:,}..{end - 1:,} ({open_txn})"
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        console.print(f"[red]restart failed:[/red] {out.stderr.strip()}")
        return False
    lines = out.stdout.splitlines()
    restored = [line.split() for line in lines if line.startswith("restored")]
    resumed = next(int(line.split()[1]) for line in lines if line.startswith("resumed"))
    replayed = int(restored[0][3]) if restored else 0
    console.print(
        f"restart: the new producer fenced the dead one and aborted its open transaction; recovery replayed "
        f"[bold]{replayed:,}[/bold] records of a {end:,}-offset changelog (only the tail past the store's "
        f"offset) and resumed at input position {resumed:,}, a commit boundary (commits every "
        f"{commit_every:,}): nothing of the killed transaction survived"
    )
    verdicts = verify_app(root / "state", CounterApp, root / "log")
    store = _native.store_dump(verdicts[0].store.path).entries if verdicts else []
    counts = {k: int(v) for k, v in store if k != POS_KEY}
    exact = (
        bool(verdicts)
        and all(v.ok for v in verdicts)
        and counts == expected_counts(records)
        and resumed % commit_every == 0
        and resumed >= committed
    )
    verdict = "[green]exact[/green]" if exact else "[red]WRONG[/red]"
    console.print(
        f"verify: store equals its committed changelog and every count equals the input's ({len(counts)} words, "
        f"{sum(counts.values()):,} records counted once each): {verdict}"
    )
    return exact


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
@click.option(
    "--dir",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to leave the demo's files (default: a new temporary directory).",
)
@click.option(
    "--records",
    type=click.IntRange(1000),
    default=2_000_000,
    show_default=True,
    help="Changelog records in total.",
)
@click.option("--partitions", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option(
    "--threads", type=click.IntRange(1), default=None, help="Restore threads (default: one per core)."
)
@click.option(
    "--counter-records",
    type=click.IntRange(2000),
    default=200_000,
    show_default=True,
    help="Input records of the exactly-once counting processor.",
)
def demo(
    out_dir: Path | None, records: int, partitions: int, threads: int | None, counter_records: int
) -> None:
    """Build a realistic changelog, restore it in parallel, verify it, and survive a SIGKILL.

    The changelog has overwrites, tombstones and aborted transactions; restoring
    skips aborted data and markers and keeps the last value of every key. Then a
    counting processor runs under exactly_once_v2, is SIGKILLed in the middle of
    a transaction, restarts, and recovers by replaying only the tail.

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
    with Progress(
        TextColumn("writing"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("partitions", total=partitions)
        stats = build_changelog(log, topic, partitions, records, on_partition=lambda _p: bar.advance(task))
    console.print(
        f"{stats.records:,} records in {partitions} partitions of [bold]{topic}[/bold] "
        f"({stats.committed:,} committed, {stats.aborted:,} in aborted transactions, "
        f"{stats.tombstones:,} tombstones, ~{stats.keys:,} keys) in {time.perf_counter() - t0:.1f}s"
    )

    console.rule("[bold]2. restore every partition in parallel")
    threads = threads or os.cpu_count() or 1
    with restore_progress(console) as progress:

        def listener_for(tp: TopicPartition) -> RestoreListener:
            return BarListener(progress, f"partition {tp.partition}")

        t0 = time.perf_counter()
        results = restore_partitions(
            log, state_dir, range(partitions), threads=threads, listener_for=listener_for
        )
        wall = time.perf_counter() - t0
    console.print(_summary(results))
    applied = sum(r.records_applied for r in results)
    console.print(
        f"{applied:,} records restored in {wall:.2f}s on {threads} threads ({applied / wall:,.0f} records/s)"
    )
    if any(r.error for r in results):
        raise click.ClickException("some partitions failed to restore (see the table)")

    console.rule("[bold]3. verify")
    verdicts = verify_app(state_dir, DEMO_APP, log_dir)
    exact = sum(v.ok for v in verdicts)
    console.print(f"{exact} of {len(verdicts)} stores equal the committed changelog exactly")
    if exact != len(verdicts):
        raise click.ClickException("verify found a store that differs from its changelog")

    console.rule("[bold]4. exactly-once: SIGKILL a counting processor mid-transaction, restart")
    crash = _crash_and_recover(root / "counter", counter_records, console)
    if not crash:
        raise click.ClickException("the counting processor did not recover exactly")

    console.rule("[bold]explore")
    console.print(f"Files left in [bold]{root}[/bold]. Try:")
    console.print(f"  statestore inspect --state-dir {state_dir} --app-id {DEMO_APP} --log-dir {log_dir}")
    console.print(f"  statestore verify --state-dir {state_dir} --app-id {DEMO_APP} --log-dir {log_dir}")
    console.print(f"  statestore log dump {log_dir} --partition {topic}-0")
    counter = root / "counter"
    console.print(
        f"  statestore inspect --state-dir {counter / 'state'} --app-id {CounterApp} --log-dir {counter / 'log'}"
    )
