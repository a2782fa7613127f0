"""``statestore clean``: run the cleaner now, or remove an application's local state."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import click

from statestore.cli.common import console, state_options
from statestore.ops.inspection import app_dir
from statestore.restore.topic_ids import forget
from statestore.state.directory import DEFAULT_CLEANUP_DELAY_MS, LOCK_FILE_NAME, StateDirectory


@click.command()
@state_options
@click.option(
    "--cleanup-delay-ms",
    type=click.IntRange(0),
    default=DEFAULT_CLEANUP_DELAY_MS,
    show_default=True,
    help="Delete task directories unmodified for this long.",
)
@click.option("--all", "remove_all", is_flag=True, help="Remove the application's whole local state.")
@click.option(
    "--topic-ids",
    is_flag=True,
    help="Only forget the changelog topic ids the stores were read under "
    "(after moving the changelogs to another cluster with their offsets).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clean(
    state_dir: Path, app_id: str, cleanup_delay_ms: int, remove_all: bool, topic_ids: bool, yes: bool
) -> None:
    """Delete unlocked task directories not modified for the cleanup delay, or everything with --all.

    Takes the application's process lock first, so it refuses to run while the
    application is running (a statestore application, or Kafka Streams, seen by
    its POSIX lock on <app>/.lock). Locked task directories are never removed.
    --topic-ids removes only the `.<store>.topic-id` files: a store restored from
    a changelog topic is held to that topic's id, and a mirror's topics have ids
    of their own.

    \b
    Examples:
      statestore clean --state-dir /var/lib/app/state --app-id counts --cleanup-delay-ms 0
      statestore clean --state-dir /var/lib/app/state --app-id counts --all --yes
      statestore clean --state-dir /var/lib/app/state --app-id counts --topic-ids
    """
    if remove_all and topic_ids:
        raise click.UsageError("--all already removes the topic ids with everything else")
    root = app_dir(state_dir, app_id)
    if remove_all and not yes:
        click.confirm(
            f"Remove all local state of {app_id} in {root}? It will be restored from the changelog",
            abort=True,
        )
    # Opened after the confirmation: its process lock (an flock, and a POSIX lock as Kafka
    # Streams takes) refuses a running application, statestore's or Kafka Streams'.
    directory = StateDirectory(state_dir, app_id, cleanup_delay_ms=cleanup_delay_ms)
    try:
        if topic_ids:
            forgotten = forget(root)
            console.print(f"forgot the topic ids of {len(forgotten)} stores")
            return
        if not remove_all:
            removed = directory.clean_removed_tasks()
            names = ": " + ", ".join(map(str, removed)) if removed else ""
            console.print(f"removed {len(removed)} task directories{names}")
            return
        # delete everything but the lock file while holding the process lock
        tasks = directory.task_dirs()
        for child in root.iterdir():
            if child.name == LOCK_FILE_NAME:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    finally:
        directory.close()
    (root / LOCK_FILE_NAME).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        root.rmdir()
    console.print(f"removed {root} ({len(tasks)} task directories)")
