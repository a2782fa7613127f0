"""Options and output helpers shared by the ``statestore`` subcommands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

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
