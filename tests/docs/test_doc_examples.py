"""Every ```python block of README.md and docs/*.md runs, as it stands, so that no example can drift.

Each block is written to a script and run by this interpreter in a fresh
temporary directory (examples use relative paths and write the data they
restore). A failure names the file and line of the block and of the
failing statement. A comment on the line before a block says what it needs:

- ``<!-- example: kafka -->``: a Kafka broker; the block's ``brokerN:PORT``
  addresses (``"broker1:9092,broker2:9092"``) become the session broker's
  (the ``kafka_bootstrap`` fixture), and the test is marked ``kafka``;
- ``<!-- example: spark -->``: starts a local Spark session (marked ``spark``);
- ``<!-- example: skip REASON -->``: deliberately not runnable (a fragment).
  Rare on purpose: :data:`MAX_SKIPPED` bounds them.

Shell blocks are not run. docs/development.md describes the convention.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_SKIPPED = 2
KINDS = ("kafka", "spark", "skip")
TIMEOUT_S = {"": 120, "kafka": 300, "spark": 600}
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_ANNOTATION = re.compile(r"^<!--\s*example:\s*(\S+)\s*(.*?)\s*-->\s*$")
_BROKERS = re.compile(r"broker\d+:\d+(?:,broker\d+:\d+)*")


def doc_files() -> list[Path]:
    """README.md and docs/*.md, the files whose examples must run."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts (the fence's line, 1-based), its language, code and annotation."""

    path: Path
    line: int
    lang: str
    code: str
    kind: str = ""
    reason: str = ""
    annotation_line: int = 0

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, each with the ``<!-- example: ... -->`` annotation just above it (if any)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    pending: tuple[int, str, str] | None = None  # (line, kind, reason) of an annotation waiting for its block
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            fence, lang, start = m.group(1), m.group(2).lower(), i
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].startswith(fence):
                body.append(lines[i])
                i += 1
            kind, reason, ann = pending if pending else ("", "", 0)
            out.append(Block(path, start + 1, lang, "\n".join(body) + "\n", kind, reason, ann))
            pending = None
        else:
            a = _ANNOTATION.match(lines[i].strip())
            if a:
                pending = (a.group(1), a.group(2), i + 1)
            elif lines[i].strip() and pending:
                # an annotation must sit right above its block (blank lines allowed)
                out.append(
                    Block(
                        path,
                        pending[0],
                        "",
                        "",
                        pending[1],
                        f"no code block follows: {lines[i]!r}",
                        pending[0],
                    )
                )
                pending = None
        i += 1
    return out


def python_blocks() -> list[Block]:
    return [
        b for p in doc_files() for b in blocks(p) if b.lang in ("python", "py") or (b.kind and not b.lang)
    ]


def _param(b: Block) -> object:
    marks: list[pytest.MarkDecorator] = []
    if b.kind == "kafka":
        marks.append(pytest.mark.kafka)
    elif b.kind == "spark":
        marks.append(pytest.mark.spark)
    elif b.kind == "skip":
        marks.append(
            pytest.mark.skip(reason=f"{b.where}: not runnable on purpose: {b.reason or '(no reason given)'}")
        )
    return pytest.param(b, id=b.where, marks=marks)


def _failing_line(b: Block, stderr: str, script: Path) -> str:
    """``file:line`` in the markdown of the last frame of ``script`` in a traceback, or ''."""
    hits = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', stderr)
    return f"{b.path.relative_to(ROOT)}:{b.line + int(hits[-1])}" if hits else ""


@pytest.mark.parametrize("block", [_param(b) for b in python_blocks()])
def test_python_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The block runs to its end in a fresh directory; an exception or a non-zero exit fails with its place."""
    assert block.lang in ("python", "py"), f"{block.where}: `<!-- example: {block.kind} -->` {block.reason}"
    assert block.kind in ("", *KINDS), (
        f"{block.where}: unknown annotation `<!-- example: {block.kind} -->` (line {block.annotation_line}); "
        f"known: {', '.join(KINDS)}"
    )
    code = block.code
    if block.kind == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        assert _BROKERS.search(code), f"{block.where}: a kafka example names its cluster as brokerN:PORT"
        code = _BROKERS.sub(bootstrap, code)
    script = tmp_path / "example.py"
    script.write_text(code)
    work = tmp_path / "work"
    work.mkdir()
    try:
        # a deprecated name used by the example itself (warnings attributed to __main__) is an error
        cmd = [sys.executable, "-W", "error::DeprecationWarning:__main__", str(script)]
        out = subprocess.run(
            cmd,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S[block.kind],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: the example did not finish within {TIMEOUT_S[block.kind]} s")
    if out.returncode != 0:
        at = _failing_line(block, out.stderr, script)
        pytest.fail(
            f"{block.where}: the example exited with {out.returncode}"
            + (f"; it failed at {at}" if at else "")
            + f"\n--- stderr (end) ---\n{out.stderr[-4000:]}\n--- stdout (end) ---\n{out.stdout[-1000:]}",
            pytrace=False,
        )


def test_blocks_are_found_and_exceptions_stay_rare() -> None:
    """The parser finds the examples (a broken parser must not pass by running nothing) and few are skipped."""
    found = python_blocks()
    readme = [b for b in found if b.path.name == "README.md"]
    assert len(readme) >= 2, (
        f"README.md should hold the TaskManager and the restore example, found {len(readme)}"
    )
    assert len(found) >= 8, f"only {len(found)} python blocks found in README.md and docs/*.md"
    skipped = [b.where for b in found if b.kind == "skip"]
    assert len(skipped) <= MAX_SKIPPED, (
        f"{len(skipped)} python blocks are marked not runnable ({', '.join(skipped)}); at most {MAX_SKIPPED}: "
        "make them runnable instead"
    )
