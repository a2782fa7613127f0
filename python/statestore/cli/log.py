"""``statestore log``: look inside a segment log (ours or an archived Kafka log dir)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from statestore.changelog.segment_log import Isolation, LogBatch, SegmentLog
from statestore.ids import TopicPartition


@click.group()
def log() -> None:
    """Inspect changelog segment logs (Kafka's on-disk format)."""


def _show(b: bytes | None, limit: int = 64) -> str:
    if b is None:
        return "null"
    try:
        text = b.decode("utf-8")
        if text.isprintable():
            return text if len(text) <= limit else text[:limit] + "…"
    except UnicodeDecodeError:
        pass
    h = b.hex()
    return "0x" + (h if len(h) <= limit else h[:limit] + "…")


def _batch_table(tp: TopicPartition, batches: list[LogBatch]) -> Table:
    t = Table(title=f"{tp}: {len(batches)} batches", title_justify="left")
    for col in (
        "segment",
        "position",
        "baseOffset",
        "lastOffset",
        "count",
        "producerId",
        "epoch",
        "transactional",
        "control",
        "outcome",
        "compression",
        "size",
        "crc",
        "crcValid",
    ):
        t.add_column(
            col,
            justify="right" if col in ("position", "baseOffset", "lastOffset", "count", "size") else "left",
        )
    for b in batches:
        t.add_row(
            b.segment,
            str(b.position),
            str(b.base_offset),
            str(b.last_offset),
            str(b.count),
            str(b.producer_id),
            str(b.producer_epoch),
            str(b.transactional).lower(),
            b.control or "",
            b.outcome or "",
            b.compression,
            str(b.size),
            f"{b.crc:08x}",
            "true" if b.crc_valid else "[red]false[/red]",
        )
    return t


@log.command()
@click.argument("log_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    metavar="TOPIC-N",
    help="Partition to dump, as '<topic>-<partition>' (repeatable; default: all).",
)
@click.option(
    "--isolation",
    type=click.Choice(["read_committed", "read_uncommitted"]),
    default="read_committed",
    show_default=True,
    help="Which records --records shows.",
)
@click.option("--records", "show_records", is_flag=True, help="Also print the records (keys and values).")
def dump(log_dir: Path, partitions: tuple[str, ...], isolation: Isolation, show_records: bool) -> None:
    """Print the batches of each partition like kafka-dump-log.

    For every batch: segment, byte position, base and last offset, record
    count, producer id and epoch, whether it is transactional, the control
    marker (COMMIT/ABORT), what became of its transaction, codec and whether
    its CRC is valid. With --records, the records a consumer with the chosen
    isolation would get.

    \b
    Example:
      statestore log dump /var/lib/app/changelog --partition app-counts-changelog-0 --records
    """
    # Wide enough for every column when the output is a file or a pipe.
    console = Console() if sys.stdout.isatty() else Console(width=180)
    slog = SegmentLog(log_dir)
    try:
        tps = [TopicPartition.parse(p) for p in partitions] if partitions else slog.partitions()
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--partition") from e
    if not tps:
        console.print(f"no partitions under {log_dir}")
        return
    for tp in tps:
        start, end, lso = slog.offsets(tp)
        batches = slog.dump(tp, records=show_records, isolation=isolation)
        console.print(_batch_table(tp, batches))
        console.print(f"{tp}: start offset {start}, end offset {end}, last stable offset {lso}")
        if show_records:
            rt = Table(title=f"{tp}: records ({isolation})", title_justify="left")
            for col in ("offset", "timestamp", "key", "value", "headers"):
                rt.add_column(col)
            for b in batches:
                for off, key, value, ts, headers in b.records or []:
                    hs = ", ".join(f"{k}={_show(v, 16)}" for k, v in headers)
                    rt.add_row(str(off), str(ts), _show(key), _show(value), hs)
            console.print(rt)
