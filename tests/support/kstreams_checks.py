"""What the interoperability tests check of a state directory Kafka Streams wrote itself.

``statestore inspect`` and ``statestore verify`` (against the changelog topics on Kafka) must report
every store of every task correctly: its format, where its offsets live, an offset with no lag, a
window or session store's segments, and data equal to its changelog.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from statestore import OffsetCheckpoint
from statestore.state.layout import LAYOUTS, store_layout, table_format_versions
from support.cli import run_cli
from support.kstreams_app import layout_of, store_flags


def check_own_state(
    bootstrap: str,
    state_dir: Path,
    app: str,
    stores: Mapping[str, tuple[str, int | None]],
    partitions: int,
    layout: str,
    subtopologies: Mapping[str, int] | None = None,
) -> None:
    """``inspect`` and ``verify`` on ``state_dir``: each of ``stores`` (name -> (format, retention;
    None for a key-value store)) in each task of its sub-topology (``subtopologies``, else 0) reported
    in ``layout`` (``"kip-1035"`` or ``"checkpoint"``) with its format, a committed offset and no lag,
    and verified exact."""
    base = ["--kafka", bootstrap, "--state-dir", str(state_dir), "--app-id", app, *store_flags(stores)]
    out = run_cli("inspect", *base, "--json", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = json.loads(out.stdout)["stores"]
    subs = subtopologies or {}
    want = sorted((f"{subs.get(n, 0)}_{p}", n) for p in range(partitions) for n in stores)
    assert sorted((r["task_id"], r["store"]) for r in reports) == want, reports
    for r in reports:
        fmt, retention = stores[r["store"]]
        assert r["problem"] is None and r["format"] == fmt and r["layout"] == layout, r
        offset = r["store_offset"] if layout == "kip-1035" else r["checkpoint_offset"]
        assert offset is not None and r["lag"] == 0, r
        if retention is None:
            assert r["kind"] == "key-value" and r["segments"] == [], r
            continue
        assert r["kind"] == "window or session" and r["segments"], r
        # Kafka Streams reads the offset of the newest segment recording one (4.3+); before, none records one
        newest = [s["store_offset"] for s in r["segments"] if s["store_offset"] is not None]
        assert (newest[-1] if newest else None) == r["store_offset"], r
    out = run_cli("verify", *base, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("exact") == len(reports), out.stdout


def check_layout(theirs: Path, ours: Path, app: str, version: str) -> None:
    """Every RocksDB statestore restored under ``ours`` (a state directory) for application ``app`` is
    in the layout of Kafka Streams ``version``; in the ``.checkpoint`` layout every table file is of
    ``format_version`` 5 at most and each task's ``.checkpoint`` records what Kafka Streams' own
    (under ``theirs``) records."""
    layout = LAYOUTS[layout_of(version)]
    databases = sorted(p.parent for p in (ours / app).rglob("CURRENT"))
    assert databases, f"no store under {ours / app}"
    for db in databases:
        assert store_layout(db) is layout, (db, store_layout(db))
        if not layout.offsets_in_store:
            assert table_format_versions(db) <= {layout.table_format_version}, db
    if layout.offsets_in_store:
        return
    for task in sorted(p for p in (ours / app).iterdir() if re.fullmatch(r"\d+_\d+", p.name)):
        ours_ckpt = OffsetCheckpoint(task / ".checkpoint").read()
        assert ours_ckpt and ours_ckpt == OffsetCheckpoint(theirs / app / task.name / ".checkpoint").read(), (
            task
        )


__all__ = ["check_layout", "check_own_state"]
