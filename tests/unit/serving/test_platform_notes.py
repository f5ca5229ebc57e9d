"""docs/platform-notes.md and the code cite each other: every workaround links to its row.

Each row of the table names the code that holds a workaround; each named file must cite the
row's anchor (`platform-notes.md#<anchor>`), and every anchor the code cites must be a row.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "backends" / "bucketserve"
NOTES = ROOT / "docs" / "platform-notes.md"
CITING_DIRS = ("backends", "client", "tests", "model_repository")

ROW = re.compile(r"^\|\s*\[P(\d+)\]\(#([a-z0-9-]+)\)\s*\|")
HEADING = re.compile(r"^### (P(\d+)\. .+)$", re.M)
CITED = re.compile(r"platform-notes\.md#([A-Za-z0-9_-]+)")


def rows() -> list[tuple[int, str, list[str]]]:
    """(number, anchor, code paths) of each table row, in order."""
    found = []
    for line in NOTES.read_text().splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"row P{m[1]} has {len(cells)} cells, not 5: {line}"
        found.append((int(m[1]), m[2], re.findall(r"`([^`]+)`", cells[3])))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def resolve(name: str) -> list[Path]:
    """The files or folder `name` means: under backends/bucketserve/ first, then the repo root."""
    for base in (PACKAGE, ROOT):
        if any(c in name for c in "*?["):
            files = sorted(p for p in base.glob(name) if p.is_file())
            if files:
                return files
        elif (base / name).exists():
            return [base / name]
    return []


def cites(path: Path, anchor: str) -> bool:
    """`path` (a folder: any file under it) cites `platform-notes.md#<anchor>`."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return any(
        anchor in CITED.findall(p.read_text(errors="ignore"))
        for p in files
        if "__pycache__" not in p.parts
    )


def test_the_table_has_every_row_once_with_its_headings_anchor():
    table = rows()
    assert len(table) >= 30, f"parsed only {len(table)} rows of {NOTES}"
    numbers = [n for n, _, _ in table]
    assert numbers == list(range(1, len(table) + 1)), numbers
    headings = {int(m[2]): slug(m[1]) for m in HEADING.finditer(NOTES.read_text())}
    for n, anchor, _ in table:
        assert headings.get(n) == anchor, (
            f"P{n}: row links #{anchor}, heading is #{headings.get(n)}"
        )


def test_every_code_file_a_row_names_links_to_that_row():
    table = rows()
    assert len(table) >= 30
    missing, unlinked, checked = [], [], 0
    for n, anchor, names in table:
        for name in names:
            paths = resolve(name)
            if not paths:
                missing.append(f"P{n}: {name}")
            for path in paths:
                checked += 1
                if not cites(path, anchor):
                    unlinked.append(
                        f"P{n}: {path.relative_to(ROOT)} lacks platform-notes.md#{anchor}"
                    )
    assert not missing, "rows name code that does not exist:\n" + "\n".join(missing)
    assert not unlinked, "code that a row names does not link to it:\n" + "\n".join(unlinked)
    assert checked >= 50, checked


def test_every_cited_anchor_is_a_row():
    anchors = {anchor for _, anchor, _ in rows()}
    files = [p for d in CITING_DIRS for p in (ROOT / d).rglob("*") if p.is_file()]
    files += [p for _, _, names in rows() for name in names for p in resolve(name) if p.is_file()]
    bad, cited = [], 0
    for path in sorted(set(files)):
        if "__pycache__" in path.parts:
            continue
        for anchor in CITED.findall(path.read_text(errors="ignore")):
            cited += 1
            if anchor not in anchors:
                bad.append(f"{path.relative_to(ROOT)}: #{anchor}")
    assert not bad, "citations of no row of docs/platform-notes.md:\n" + "\n".join(bad)
    assert cited >= 30, cited
