"""Run every benchmark in ``benches/`` and record the ratios in BENCHMARKS.md.

Each benchmark measures its baseline and its candidate in the same run and
stores ``baseline``, ``candidate``, ``ratio`` and ``goal`` (plus any figures it
likes) in pytest-benchmark's ``extra_info``; this script turns the JSON into the
table in BENCHMARKS.md, dated and with the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
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
    """Markdown table of the ratios in a pytest-benchmark JSON document."""
    rows = [
        "| benchmark | candidate | baseline | ratio | goal | met | details |",
        "|---|---|---|---:|---:|:-:|---|",
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
        rows.append(f"| {bench['name']} | {cand} | {base} | {r} | {g} | {met} | {details} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / ".benchmarks" / "latest.json")
    ap.add_argument("--no-markdown", action="store_true", help="only write the JSON")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (e.g. -k decode)")
    args = ap.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", str(ROOT / "benches"), "-q", "-s", "-p", "no:cacheprovider",
        f"--benchmark-json={args.json}", *args.pytest_args,
    ]
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0 or args.no_markdown:
        return rc
    results = json.loads(args.json.read_text())
    scale = os.environ.get("STATESTORE_BENCH_SCALE", "1.0")
    doc = [
        "# Benchmarks",
        "",
        "Every row compares a candidate with a baseline measured in the same run on the same machine;",
        "the ratio is baseline time / candidate time (higher is better) unless the row says otherwise.",
        "Regenerate with `make bench`.",
        "",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        f"- scale: {scale}",
        "",
        table(results),
        "",
    ]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(doc))
    print((ROOT / "BENCHMARKS.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
