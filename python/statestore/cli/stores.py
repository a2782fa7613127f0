"""How the command line names stores: ``--store NAME[@SUBTOPOLOGY]``, ``--topology FILE``,
``--store-format NAME=FORMAT`` and ``--retention NAME=MS``, and the stores they establish.

``--store counts@1`` puts a store in subtopology 1 (task directories
``1_<p>``) without a topology file; ``--topology FILE`` (the text
``Topology.describe()`` prints) gives every store its subtopology, and the
changelog topics' configs its kind (:mod:`statestore.restore.discovery`). A
topology that does not parse or disagrees with the changelogs or the state
directory is a usage error naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from statestore.changelog.segment_log import SegmentLog
from statestore.errors import TopologyError
from statestore.ids import changelog_topic
from statestore.restore.discovery import FoundStore, check_state_dir, discover_stores
from statestore.state.store import check_format
from statestore.state.topology import Topology, read_topology

if TYPE_CHECKING:
    from statestore.changelog.kafka import KafkaChangelog

F = TypeVar("F", bound=Callable[..., Any])

_STORE_RE = re.compile(r"([^@/]+)(?:@(0|[1-9][0-9]{0,9}))?")


def topology_option(func: F) -> F:
    """``--topology FILE``: the application's ``Topology.describe()`` text."""
    return click.option(
        "--topology",
        "topology_file",
        default=None,
        type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
        help="The text the application's Topology.describe() prints: gives every store its sub-topology "
        "(and, from Kafka, the changelog configs give its kind).",
    )(func)


def segmented_options(func: F) -> F:
    """``--store-format NAME=FORMAT`` and ``--retention NAME=MS`` for the tools that read stores
    (``inspect``, ``verify``): what a window, session or versioned store's bytes do not tell."""
    func = click.option(
        "--retention",
        "retentions",
        multiple=True,
        metavar="NAME=MS",
        help="A window or session store's retention in milliseconds (its segments do not tell it; "
        "verify rebuilds the store with it), or a versioned store's history retention (with --kafka: "
        "its changelog's min.compaction.lag.ms less a day unless given); repeatable.",
    )(func)
    return click.option(
        "--store-format",
        "store_formats",
        multiple=True,
        metavar="NAME=FORMAT",
        help="A store's format where its bytes do not tell it: window or session for a store of plain "
        "segments (timestamped segments are a timestamped-window store); versioned for a versioned "
        "store (its bytes look like a plain store's; with --kafka its changelog tells it); repeatable.",
    )(func)


def parse_store_names(items: tuple[str, ...]) -> dict[str, int | None]:
    """``--store NAME`` or ``NAME@SUBTOPOLOGY`` options: name -> subtopology (None: not given)."""
    out: dict[str, int | None] = {}
    for item in items:
        m = _STORE_RE.fullmatch(item)
        if m is None or m.group(1) in (".", ".."):
            raise click.BadParameter(
                f"expected NAME or NAME@SUBTOPOLOGY (e.g. counts@1); got {item!r}", param_hint="--store"
            )
        out[m.group(1)] = None if m.group(2) is None else int(m.group(2))
    return out


def parse_store_formats(items: tuple[str, ...]) -> dict[str, str]:
    """``NAME=FORMAT`` options as a dict; a usage error names a bad one."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, fmt = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError("expected NAME=FORMAT")
            out[name] = check_format(fmt)
        except ValueError as e:
            raise click.BadParameter(f"{e}; got {item!r}", param_hint="--store-format") from None
    return out


def parse_retentions(items: tuple[str, ...]) -> dict[str, int]:
    """``NAME=MS`` options (a window or session store's retention, milliseconds)."""
    out: dict[str, int] = {}
    for item in items:
        name, eq, ms = item.partition("=")
        if not eq or not name or not ms.isdigit():
            raise click.BadParameter(f"expected NAME=MILLISECONDS; got {item!r}", param_hint="--retention")
        out[name] = int(ms)
    return out


def load_topology(path: Path) -> Topology:
    """The topology in ``path``; a usage error naming the line if it does not parse."""
    try:
        return read_topology(path)
    except TopologyError as e:
        raise click.UsageError(str(e)) from e


def check_topology_against_state(topology: Topology, state_dir: Path, application_id: str) -> None:
    """A usage error when the state directory disagrees with the topology (see ``check_state_dir``)."""
    try:
        check_state_dir(topology, state_dir, application_id)
    except TopologyError as e:
        raise click.UsageError(str(e)) from e


def found_stores(
    topology: Topology,
    application_id: str,
    *,
    changelog: KafkaChangelog | None,
    log_dir: Path | None,
    names: Mapping[str, int | None],
    formats: Mapping[str, str],
    retentions: Mapping[str, int],
    state_dir: Path,
) -> list[FoundStore]:
    """The stores ``topology`` names (or those of ``names``) with their kinds, from Kafka's topic
    configs or a segment log's topics; a usage error when the topology disagrees with either."""
    if changelog is not None:
        topics = set(changelog.topics())
        wanted = [changelog_topic(application_id, n) for n in (names or topology.task_stores)]
        configs: dict[str, dict[str, str]] | None = changelog.topic_configs(
            [t for t in wanted if t in topics]
        )
    else:
        assert log_dir is not None
        topics = {tp.topic for tp in SegmentLog(log_dir).partitions()}
        configs = None
    try:
        return discover_stores(
            topology,
            application_id,
            changelog_topics=topics,
            topic_configs=configs,
            names=names or None,
            formats=formats,
            retentions=retentions,
            state_dir=state_dir,
        )
    except TopologyError as e:
        raise click.UsageError(str(e)) from e


__all__ = [
    "check_topology_against_state",
    "found_stores",
    "load_topology",
    "parse_retentions",
    "parse_store_formats",
    "parse_store_names",
    "segmented_options",
    "topology_option",
]
