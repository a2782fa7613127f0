"""Every relative link of README.md, BENCHMARKS.md and docs/*.md points at a file that exists (and at a
heading that exists, when it names one), every file of the repository they name exists, and the
README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCED = re.compile(r"^(`{3,}|~{3,}).*?^\1\s*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_TOP = ("python", "tests", "benches", "rust", "scripts", "examples", "fuzz", "interop", "docs")
# folders of python/statestore/ and rust/src/ that the docs name without their prefix (`state/store.py`)
_PACKAGE_GROUPS = tuple(
    sorted(
        {"changelog", "state", "processing", "restore", "ops", "cli", "_testing"}
        | {
            d.name
            for base in ("python/statestore", "rust/src")
            for d in (ROOT / base).iterdir()
            if d.is_dir()
        }
        - {"__pycache__"}
    )
)
_NAMED_PATH = re.compile(rf"`((?:{'|'.join(_TOP + _PACKAGE_GROUPS)})/[^`\s]*)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # backticks and punctuation go; letters, digits, _ and - stay
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _FENCED.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of each link in the prose of ``path``."""
    text = path.read_text()
    stripped = _FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep line numbers
    out = []
    for no, line in enumerate(stripped.splitlines(), 1):
        for m in _LINK.finditer(_INLINE_CODE.sub("", line)):
            out.append((no, m.group(1)))
    return out


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for no, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{path.relative_to(ROOT)}:{no}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{path.relative_to(ROOT)}:{no}: {target}: no heading #{anchor} in {dest.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(path: Path) -> None:
    """A path the prose names in code (`tests/state/test_store.py`, `state/store.py`: under python/statestore/
    or rust/src/) exists, so that a module or test that moves takes its docs along."""
    text = _FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    missing = []
    for no, line in enumerate(text.splitlines(), 1):
        for m in _NAMED_PATH.finditer(line):
            named = m.group(1).split("::")[0].rstrip(".,;:)")
            if "<" in named or "{" in named:  # a pattern (`fuzz/corpus/<target>/`), not a path
                continue
            bases = (
                [ROOT]
                if named.split("/")[0] in _TOP
                else [ROOT / "python" / "statestore", ROOT / "rust" / "src"]
            )
            if not any(list(b.glob(named.rstrip("/"))) for b in bases):
                missing.append(f"{path.relative_to(ROOT)}:{no}: `{named}`")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_make_targets_exist(path: Path) -> None:
    """Every `make TARGET` the docs name (in code) is a target of the Makefile."""
    targets = set(re.findall(r"^([A-Za-z0-9_-]+):", (ROOT / "Makefile").read_text(), re.M))
    unknown, in_code = [], False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r"^(`{3,}|~{3,})", line):
            in_code = not in_code
            continue
        named = re.findall(r"^\s*make ([a-z][a-z0-9-]*)" if in_code else r"`make ([a-z][a-z0-9-]*)", line)
        unknown += [f"{path.relative_to(ROOT)}:{no}: make {t}" for t in named if t not in targets]
    assert not unknown, "make targets the docs name that the Makefile lacks:\n" + "\n".join(unknown)


def test_docs_are_linked_from_the_readme() -> None:
    """Every page of docs/ is in the README's index, so none is orphaned."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(ROOT / "README.md")}
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs not linked from README.md: {orphans}"


def test_readme_is_a_front_page() -> None:
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to docs/"
    )
