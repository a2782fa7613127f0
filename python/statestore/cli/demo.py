"""``statestore demo``: a small end-to-end run on the embedded default."""

from __future__ import annotations

import struct
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from statestore import OffsetCheckpoint, TaskId, TopicPartition, _native, changelog_topic


@click.command()
@click.option("--dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to leave the demo's files (default: a new temporary directory).")
@click.option("--records", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True,
              help="How many records to write into the store.")
def demo(out_dir: Path | None, records: int) -> None:
    """Write a store with its changelog offset, and a Kafka-format checkpoint, then read both back.

    \b
    Example:
      statestore demo --records 50000 --dir /tmp/statestore-demo
    """
    console = Console()
    root = out_dir or Path(tempfile.mkdtemp(prefix="statestore-demo-"))
    app, store, task = "demo-app", "counts", TaskId(0, 0)
    task_dir = root / "state" / app / str(task)
    store_dir = task_dir / "rocksdb" / store
    store_dir.parent.mkdir(parents=True, exist_ok=True)
    tp = TopicPartition(changelog_topic(app, store), task.partition)

    t0 = time.perf_counter()
    chunk = 50_000
    for lo in range(0, records, chunk):
        items = [(b"key-%08d" % i, struct.pack(">q", i)) for i in range(lo, min(records, lo + chunk))]
        last = lo + len(items) - 1
        # the status marker says OPEN while writing and CLOSED after the last batch (a clean close)
        _native.store_write_batch(str(store_dir), items, {str(tp): last}, 0 if last == records - 1 else 1)
    write_s = time.perf_counter() - t0
    ckpt = OffsetCheckpoint(task_dir / ".checkpoint")
    ckpt.write({tp: records - 1})

    entries, offsets, status = _native.store_dump(str(store_dir))
    table = Table(title="statestore demo")
    table.add_column("what")
    table.add_column("value", overflow="fold")
    table.add_row("store", str(store_dir))
    table.add_row("records written", f"{records:,} in {write_s:.2f}s")
    table.add_row("records read back", f"{len(entries):,}")
    table.add_row("offset in store", f"{tp} -> {offsets.get(str(tp))}")
    table.add_row("status marker", {1: "OPEN", 0: "CLOSED (clean)"}.get(status if status is not None else -1, "none"))
    table.add_row("checkpoint file", f"{ckpt.path}: {ckpt.path.read_bytes()!r}")
    table.add_row("checkpoint read", ", ".join(f"{k} -> {v}" for k, v in ckpt.read().items()))
    console.print(table)
    if len(entries) != records or offsets.get(str(tp)) != records - 1:
        raise click.ClickException("the store does not hold what was written")
    console.print(f"Files left in [bold]{root}[/bold]")
