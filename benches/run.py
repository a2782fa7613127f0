"""Run the benchmarks in ``benches/`` and record the ratios in BENCHMARKS.md.

Each benchmark measures its baseline and its candidate in the same run and
stores ``baseline``, ``candidate``, ``ratio`` and ``goal`` (plus any figures it
likes) in pytest-benchmark's ``extra_info``. Every result is kept in
``benches/results.json`` (committed) with the date, machine and scale it was
measured at; this script merges a run into it -- a run of some modules
(``--only benches/test_bench_kafka.py``) replaces only their rows, a run of
everything replaces all -- and writes the table in BENCHMARKS.md from it,
followed by the hand-written notes of ``benches/notes.md``. When a benchmark
fails, the ones that passed are still recorded and the failed ones keep their
older rows; the exit status stays pytest's.

BENCHMARKS.md is generated, never edited by hand: it is a function of
``benches/results.json`` and ``benches/notes.md`` alone (:func:`render_text`),
and ``tests/docs/`` checks that the committed file is exactly that. After
editing the notes, ``python benches/run.py --render-only`` rewrites it
without running a benchmark.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """Cores, memory and CPU model of this machine, for the record."""
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 2**20
    except OSError:
        pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, {cpu}, Python {platform.python_version()}"


def table(results: dict[str, object]) -> str:
    """Markdown table of the ratios in a results document (``benchmarks``: name, extra_info, measured)."""
    rows = [
        "| benchmark | candidate | baseline | ratio | goal | met | details | measured |",
        "|---|---|---|---:|---:|:-:|---|---|",
    ]
    for bench in results.get("benchmarks", []):  # type: ignore[union-attr]
        info = dict(bench.get("extra_info", {}))
        ratio = info.pop("ratio", None)
        goal = info.pop("goal", None)
        cand = info.pop("candidate", bench["name"])
        base = info.pop("baseline", "")
        met = "" if ratio is None or goal is None else ("yes" if ratio >= goal else "**no**")
        details = ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        r = "" if ratio is None else f"{ratio:.2f}"
        g = "" if goal is None else f">= {goal}"
        when = bench.get("measured", "")
        rows.append(f"| {bench['name']} | {cand} | {base} | {r} | {g} | {met} | {details} | {when} |")
    return "\n".join(rows)


def chart(results: dict[str, object], path: Path) -> bool:
    """Bar chart of each benchmark's ratio against its goal; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)")
        return False
    rows = [
        (b["name"].removeprefix("test_"), b["extra_info"]["ratio"], b["extra_info"].get("goal"))
        for b in results.get("benchmarks", [])  # type: ignore[union-attr]
        if "ratio" in b.get("extra_info", {})
    ]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    names = [r[0] for r in rows]
    ratios = [r[1] for r in rows]
    colors = ["#2a9d8f" if r[2] is None or r[1] >= r[2] else "#e76f51" for r in rows]
    ax.barh(names, ratios, color=colors)
    for i, (_n, ratio, goal) in enumerate(rows):
        if goal is not None:
            ax.plot([goal, goal], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(ratio, i, f" {ratio:.2f}x", va="center")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio (higher is better; black tick = goal)")
    ax.set_title("statestore benchmarks: candidate vs baseline, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def scale_points(results: dict[str, object]) -> dict[str, list[tuple[int, float]]]:
    """``{"<mode> (<shape>[, not cached][, Kafka])": [(records, records/s), ...]}`` from the rows of
    ``test_restore_at_size`` (the segment log; ``-cold``: the log not cached) and
    ``test_restore_from_kafka_at_size`` (native Kafka)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    sources = {"test_restore_at_size[": "", "test_restore_from_kafka_at_size[": ", Kafka"}
    for b in results.get("benchmarks", []):  # type: ignore[union-attr]
        name = str(b["name"])
        info = b.get("extra_info", {})
        prefix = next((p for p in sources if name.startswith(p)), None)
        if prefix is None or "records_per_s" not in info:
            continue
        shape, _size, mode, *cold = name.removeprefix(prefix).rstrip("]").split("-")
        how = ", not cached" if cold == ["cold"] else ""
        curves.setdefault(f"{mode} ({shape}{how}{sources[prefix]})", []).append(
            (int(info["records"]), float(info["records_per_s"]))
        )
    return {k: sorted(v) for k, v in curves.items()}


def scale_chart(results: dict[str, object], path: Path) -> bool:
    """Records/s against records restored (log-log), one line per mode and shape; False if nothing to draw."""
    curves = scale_points(results)
    if not curves:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in sorted(curves.items()):
        style = "--" if label.endswith(", Kafka)") else "-"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records restored (segment log; dashed: native Kafka; 100-byte values)")
    ax.set_ylabel("records/s")
    ax.set_title("statestore restores at growing sizes (benches/test_bench_scale.py)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


RESULTS = ROOT / "benches" / "results.json"
# Modules a full run leaves out (they write tens of GB and run for many minutes; pytest marker `scale`):
# they run only when named (--only), and a full run keeps their rows.
BY_NAME_ONLY = ("benches/test_bench_scale.py", "benches/test_bench_kstreams_scale.py")


def merge(run: dict[str, object], *, full: bool, stamp: str) -> dict[str, object]:
    """``benches/results.json`` with this run's results in place of the same benchmarks' older ones.

    A full run (every module) replaces the whole document, so removed
    benchmarks disappear; a partial run keeps the other modules' rows in order.
    """
    fresh = [
        {
            "name": b["name"],
            "module": b.get("fullname", "").split("::", 1)[0],
            "extra_info": b.get("extra_info", {}),
            "measured": stamp,
        }
        for b in run.get("benchmarks", [])  # type: ignore[union-attr]
    ]
    kept: list[dict[str, object]] = (
        json.loads(RESULTS.read_text()).get("benchmarks", []) if RESULTS.exists() else []
    )
    if full:
        # a full run replaces everything but the rows of the modules it leaves out
        kept = [b for b in kept if b.get("module") in BY_NAME_ONLY]
        fresh_names = {b["name"] for b in fresh}
        return {"machine": machine(), "benchmarks": fresh + [b for b in kept if b["name"] not in fresh_names]}
    by_name = {b["name"]: b for b in fresh}
    merged = [by_name.pop(str(b["name"]), b) for b in kept]
    return {"machine": machine(), "benchmarks": merged + list(by_name.values())}


NOTES = ROOT / "benches" / "notes.md"  # hand-written context (e.g. one-off Kafka runs), kept across runs
CHART = "docs/benchmarks.png"
SCALE_CHART = "docs/benchmarks-scale.png"


def render_text(results: dict[str, object], notes: str) -> str:
    """The text of BENCHMARKS.md: a function of ``results`` (``benches/results.json``) and ``notes`` only.

    Nothing here depends on the machine it runs on (the machine named is the
    one the results record) or on what is installed, so the committed file
    can be checked against its sources anywhere.
    """
    benches = results.get("benchmarks", [])  # type: ignore[union-attr]
    stamp = max((str(b.get("measured", "")) for b in benches), default="")
    doc = [
        "# Benchmarks",
        "",
        "<!-- Generated by benches/run.py from benches/results.json and benches/notes.md: edit those, then run",
        "     `python benches/run.py --render-only` (or `make bench` to measure again). -->",
        "",
        "Every row compares a candidate with a baseline measured in the same run on the same machine;",
        "the ratio is baseline time / candidate time (higher is better) unless the row says otherwise.",
        "Regenerate with `make bench`.",
        "",
        f"- last run: {stamp}; each row says when it was measured (`make bench` runs all,",
        "  `make bench BENCH=benches/test_bench_x.py` re-measures one module and keeps the other rows)",
        f"- machine: {results.get('machine', 'not recorded')}",
        "",
        table(results),
        "",
    ]
    if any("ratio" in b.get("extra_info", {}) for b in benches):
        doc += [
            "The chart shows each ratio; the black tick is the goal, red bars miss it.",
            "",
            f"![benchmark ratios]({CHART})",
            "",
        ]
    if scale_points(results):
        doc += [
            "Restores at growing sizes (`benches/test_bench_scale.py`): records/s against records restored.",
            "",
            f"![restores at growing sizes]({SCALE_CHART})",
            "",
        ]
    doc += (
        "\n".join(line for line in notes.splitlines() if not line.startswith("<!--")).strip("\n").split("\n")
    )
    return "\n".join(doc).rstrip("\n") + "\n"


def render(results: dict[str, object]) -> None:
    """Write BENCHMARKS.md from ``results`` and ``benches/notes.md``, and redraw the chart."""
    chart(results, ROOT / CHART)
    scale_chart(results, ROOT / SCALE_CHART)
    notes = NOTES.read_text() if NOTES.exists() else ""
    (ROOT / "BENCHMARKS.md").write_text(render_text(results, notes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / ".benchmarks" / "latest.json")
    ap.add_argument("--no-markdown", action="store_true", help="only write the JSON")
    ap.add_argument(
        "--only",
        nargs="+",
        type=Path,
        default=None,
        metavar="MODULE",
        help="run only these benchmark modules and replace only their rows",
    )
    ap.add_argument(
        "--render-only",
        "--render",
        dest="render",
        action="store_true",
        help="run nothing: rewrite BENCHMARKS.md (and the chart) from benches/results.json and the notes",
    )
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (e.g. -k decode)")
    args = ap.parse_args()
    if args.render:
        render(json.loads(RESULTS.read_text()))
        return 0
    args.json.parent.mkdir(parents=True, exist_ok=True)
    targets = [str(p) for p in args.only] if args.only else [str(ROOT / "benches")]
    marks = [] if args.only else ["-m", "not scale"]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        f"--benchmark-json={args.json}",
        *marks,
        *args.pytest_args,
    ]
    started = time.time()
    rc = subprocess.call(cmd, cwd=ROOT)
    run = None if args.no_markdown else this_runs_json(args.json, started)
    if run is None:
        return rc
    if rc != 0:
        print(
            f"run.py: pytest exited with {rc}; recording the benchmarks that passed, "
            "the others keep their older rows",
            file=sys.stderr,
        )
    scale = os.environ.get("STATESTORE_BENCH_SCALE", "1.0")
    stamp = f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, scale {scale}"
    # a failed run is never full: the rows of the benchmarks that failed must not disappear
    results = merge(run, full=rc == 0 and not args.only and not args.pytest_args, stamp=stamp)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    render(results)
    print((ROOT / "BENCHMARKS.md").read_text())
    return rc


def this_runs_json(path: Path, started: float) -> dict[str, object] | None:
    """The pytest-benchmark JSON this run wrote, or None (not written, or left by an earlier run).

    pytest-benchmark writes it when tests fail too, with the benchmarks that passed: a scale
    run of half an hour keeps those when one row fails (a full disk, a broker that did not start).
    """
    if not path.exists() or path.stat().st_mtime < started:
        return None
    run: dict[str, object] = json.loads(path.read_text())
    return run if run.get("benchmarks") else None


if __name__ == "__main__":
    sys.exit(main())
