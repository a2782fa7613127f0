"""Options and output helpers shared by the ``statestore`` subcommands."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from rich.text import Text

from statestore.ids import TopicPartition

if TYPE_CHECKING:
    from statestore.changelog.kafka import KafkaChangelog
    from statestore.restore.work import PartitionWork

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)


def state_options(func: F) -> F:
    """``--state-dir`` and ``--app-id``, required by every command that reads local state."""
    func = click.option(
        "--app-id", "app_id", required=True, help="Application id: state lives in <state-dir>/<app-id>/."
    )(func)
    func = click.option(
        "--state-dir",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Root state directory (Kafka's state.dir).",
    )(func)
    return func


def log_dir_option(required: bool) -> Callable[[F], F]:
    """``--log-dir``: the embedded changelog's directory."""
    return click.option(
        "--log-dir",
        required=required,
        default=None,
        type=click.Path(exists=True, file_okay=False, readable=True, path_type=Path),
        help="Directory of the changelog segment log (<log-dir>/<topic>-<partition>/).",
    )


def kafka_options(func: F) -> F:
    """``--kafka BOOTSTRAP`` and repeatable ``--kafka-config key=value``.

    A Kafka changelog instead of ``--log-dir``.
    """
    func = click.option(
        "--kafka-config",
        "kafka_config",
        multiple=True,
        metavar="KEY=VALUE",
        help="A librdkafka property for every Kafka client, e.g. security.protocol=SSL (repeatable).",
    )(func)
    func = click.option(
        "--kafka",
        "kafka",
        default=None,
        metavar="BOOTSTRAP",
        help="The changelog is on this Kafka cluster (bootstrap servers, e.g. broker1:9092,broker2:9092).",
    )(func)
    return func


def kafka_changelog(bootstrap: str, config: tuple[str, ...]) -> KafkaChangelog:
    """A KafkaChangelog from ``--kafka`` and ``--kafka-config``; a usage error names a bad option."""
    try:
        from statestore.changelog.kafka import KafkaChangelog
    except ImportError as e:  # pragma: no cover - only without the extra
        raise click.UsageError(f"--kafka needs confluent-kafka: pip install 'statestore[kafka]' ({e})") from e
    from statestore.changelog.kafka.common import parse_properties

    try:
        props: dict[str, Any] = dict(parse_properties(config))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--kafka-config") from e
    try:
        return KafkaChangelog(bootstrap, **props)
    except ImportError as e:  # pragma: no cover - only without the extra
        raise click.UsageError(f"--kafka needs confluent-kafka: pip install 'statestore[kafka]' ({e})") from e


def kafka_plan(
    changelog: KafkaChangelog,
    application_id: str,
    stores: Sequence[str] | Mapping[str, int],
    partitions: list[int] | None,
) -> list[PartitionWork]:
    """The (store, partition) pairs to restore from Kafka: every partition of each store's changelog topic.

    Planning asks the cluster (:func:`statestore.restore.planning.plan`); stores default
    to every ``<application_id>-<store>-changelog`` topic. A missing topic or a
    partition the topic lacks is a usage error.
    """
    from statestore.errors import StateStoreError
    from statestore.ids import changelog_topic
    from statestore.restore.planning import changelog_stores, plan

    subs = dict(stores) if isinstance(stores, Mapping) else dict.fromkeys(stores, 0)
    names = list(subs) or changelog_stores(changelog, application_id)
    if not names:
        raise click.UsageError(
            f"no changelog topic of application {application_id!r} on "
            f"{changelog.bootstrap_servers}; check --app-id or name the stores with --store"
        )
    topics = changelog.topics()
    for name in names:
        topic = changelog_topic(application_id, name)
        n = topics.get(topic)
        if n is None:
            raise click.UsageError(
                f"store {name}: changelog topic {topic} does not exist on {changelog.bootstrap_servers}"
            )
        bad = [p for p in partitions or () if p >= n]
        if bad:
            raise click.UsageError(
                f"store {name}: changelog topic {topic} has {n} partitions, no partition {bad}"
            )
    try:
        return plan(changelog, application_id, subs or names, partitions)
    except StateStoreError as e:
        raise click.UsageError(str(e)) from e


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def show_bytes(b: bytes | None, limit: int = 40) -> str:
    """A short printable form of a key or value (``None`` for a missing side)."""
    if b is None:
        return "(missing)"
    text = repr(b)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RateColumn(ProgressColumn):
    """Offsets restored per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:>12,.0f} rec/s", style="cyan")


class BarListener:
    """A RestoreListener that moves one progress bar (called from restoring threads).

    Once the whole log is read the bar is full and says the store is being written
    until the restore ends: a bulk restore's sort and SST files, or a long replay's
    merge, take a while and report nothing.
    """

    #: What the bar's description gains between the last record read and the end.
    WRITING = " (writing the store)"

    def __init__(self, progress: Progress, description: str) -> None:
        self.progress = progress
        self.description = description
        self.task = progress.add_task(description, total=None, start=False)
        self.start = 0
        self.end = 0

    def on_restore_start(
        self, tp: TopicPartition, store_name: str, start_offset: int, end_offset: int
    ) -> None:
        self.start, self.end = start_offset, end_offset
        self.progress.update(self.task, total=max(0, end_offset - start_offset))
        self.progress.start_task(self.task)

    def on_batch_restored(
        self, tp: TopicPartition, store_name: str, batch_end_offset: int, num_restored: int
    ) -> None:
        done = batch_end_offset + 1 - self.start
        if batch_end_offset + 1 >= self.end:
            self.progress.update(self.task, completed=done, description=self.description + self.WRITING)
        else:
            self.progress.update(self.task, completed=done)

    def on_restore_end(self, tp: TopicPartition, store_name: str, total_restored: int) -> None:
        total = self.progress.tasks[self.task].total or 0
        self.progress.update(self.task, completed=total, description=self.description)


def restore_progress(console: Console) -> Progress:
    """Live progress bars for restorations: one bar per store, offsets done, records/s, ETA."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeRemainingColumn(),
        console=console,
    )
