"""``statestore clean``: run the cleaner now, or remove an application's local state."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import click

from statestore.cli.common import console, state_options
from statestore.ops.inspection import app_dir
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
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clean(state_dir: Path, app_id: str, cleanup_delay_ms: int, remove_all: bool, yes: bool) -> None:
    """Delete unlocked task directories not modified for the cleanup delay, or everything with --all.

    Takes the application's process lock first, so it refuses to run while the
    application is running. Locked task directories are never removed.

    \b
    Examples:
      statestore clean --state-dir /var/lib/app/state --app-id counts --cleanup-delay-ms 0
      statestore clean --state-dir /var/lib/app/state --app-id counts --all --yes
    """
    root = app_dir(state_dir, app_id)
    if remove_all and not yes:
        click.confirm(
            f"Remove all local state of {app_id} in {root}? It will be restored from the changelog",
            abort=True,
        )
    directory = StateDirectory(state_dir, app_id, cleanup_delay_ms=cleanup_delay_ms)
    try:
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
