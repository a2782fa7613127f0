"""BENCHMARKS.md is generated from its sources, and the README quotes it rather than inventing figures.

``benches/run.py`` renders BENCHMARKS.md from ``benches/results.json`` and
``benches/notes.md``; the committed file must be exactly what they give. It is
imported by file path: ``benches/`` is not on the test path.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python benches/run.py --render-only"


def run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("statestore_benches_run", ROOT / "benches" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def results() -> dict[str, object]:
    return json.loads((ROOT / "benches" / "results.json").read_text())


def test_benchmarks_md_is_what_its_sources_give() -> None:
    expected = run_py().render_text(results(), (ROOT / "benches" / "notes.md").read_text())
    committed = (ROOT / "BENCHMARKS.md").read_text()
    if committed != expected:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(),
                    expected.splitlines(),
                    "BENCHMARKS.md (committed)",
                    "rendered from the sources",
                    lineterm="",
                    n=1,
                )
            )[:40]
        )
        raise AssertionError(
            "BENCHMARKS.md is generated from benches/results.json and benches/notes.md and differs from them: "
            f"edit the notes (not BENCHMARKS.md), then run `{REGENERATE}`\n{diff}"
        )


def test_rendering_measures_nothing_and_ignores_the_machine() -> None:
    """The render is a function of its two inputs: no machine name or chart library leaks in."""
    run = run_py()
    a = run.render_text(results(), "notes")
    assert a == run.render_text(results(), "notes")
    assert f"- machine: {results()['machine']}" in a


def test_readme_headline_ratios_are_benchmarks_md_figures() -> None:
    """Each ``[R x](BENCHMARKS.md "benchmark")`` of the README is that benchmark's ratio in results.json."""
    readme = (ROOT / "README.md").read_text()
    quoted = re.findall(r'\[([\d.]+)x\]\(BENCHMARKS\.md "([^"]+)"\)', readme)
    assert len(quoted) == 5, (
        f"the README's table of headline ratios should have five rows, found {len(quoted)}"
    )
    ratios = {b["name"]: b["extra_info"].get("ratio") for b in results()["benchmarks"]}  # type: ignore[index,union-attr]
    wrong = [
        f"{name}: README says {shown}x, results.json {ratios.get(name)}"
        for shown, name in quoted
        if name not in ratios or ratios[name] is None or f"{ratios[name]:.2f}" != shown
    ]
    assert not wrong, "README ratios that BENCHMARKS.md does not show:\n" + "\n".join(wrong)


def test_a_failed_run_records_what_passed_and_keeps_the_older_rows_of_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_py()
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results.json")
    old = {"name": "test_a", "module": "benches/x.py", "extra_info": {"ratio": 1.0}, "measured": "then"}
    (tmp_path / "results.json").write_text(json.dumps({"benchmarks": [old, {**old, "name": "test_b"}]}))
    started = time.time()
    latest = tmp_path / "latest.json"
    latest.write_text(
        json.dumps(
            {
                "benchmarks": [
                    {"name": "test_a", "fullname": "benches/x.py::test_a", "extra_info": {"ratio": 2.0}}
                ]
            }
        )
    )
    this_run = run.this_runs_json(latest, started)
    assert this_run is not None
    merged = run.merge(this_run, full=False, stamp="now")["benchmarks"]
    assert [(b["name"], b["extra_info"]["ratio"], b["measured"]) for b in merged] == [
        ("test_a", 2.0, "now"),
        ("test_b", 1.0, "then"),
    ]
    # a JSON an earlier run left behind (pytest stopped before writing its own) records nothing
    os.utime(latest, (started - 60, started - 60))
    assert run.this_runs_json(latest, started) is None
    assert run.this_runs_json(tmp_path / "missing.json", started) is None


def test_a_failed_benchmark_run_exits_with_pytest_s_code_and_writes_what_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # main() end to end, with pytest replaced by a run that writes one benchmark's JSON and fails.
    run = run_py()
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results.json")
    rendered: list[dict[str, object]] = []
    monkeypatch.setattr(run, "render", rendered.append)
    monkeypatch.setattr(run, "ROOT", tmp_path)
    (tmp_path / "BENCHMARKS.md").write_text("rendered\n")
    old = {"name": "test_a", "module": "benches/x.py", "extra_info": {"ratio": 1.0}, "measured": "then"}
    (tmp_path / "results.json").write_text(json.dumps({"benchmarks": [old, {**old, "name": "test_b"}]}))
    latest = tmp_path / "latest.json"
    asked: list[list[str]] = []

    def pytest_that_fails(cmd: list[str], cwd: Path) -> int:
        asked.append(cmd)
        passed = {"name": "test_a", "fullname": "benches/x.py::test_a", "extra_info": {"ratio": 2.0}}
        latest.write_text(json.dumps({"benchmarks": [passed]}))
        return 1

    monkeypatch.setattr(run.subprocess, "call", pytest_that_fails)
    monkeypatch.setattr(sys, "argv", ["run.py", "--json", str(latest)])
    assert run.main() == 1, "the run's exit code is pytest's"
    assert "-m" in asked[0] and "not scale" in asked[0], "a whole run leaves the scale modules out"
    written = json.loads((tmp_path / "results.json").read_text())["benchmarks"]
    assert [(b["name"], b["extra_info"]["ratio"]) for b in written] == [("test_a", 2.0), ("test_b", 1.0)], (
        "a failed whole run is merged as a partial one: test_b keeps its row"
    )
    assert rendered and rendered[0]["benchmarks"] == written
    assert "recording the benchmarks that passed" in capsys.readouterr().err
