"""Every reference to a docs page, a section of one, or a docs/scripts file resolves: docs are a reference,
and a citation of a section that was rewritten away misleads the reader."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    *ROOT.glob("docs/*.md"),
    ROOT / "README.md",
    *(p for p in ROOT.glob("docs/scripts/**/*") if p.is_file()),
    *ROOT.glob("tailjit/**/*.py"),
    *ROOT.glob("tests/**/*.py"),
]
PAGE = re.compile(r"docs/(\w+)\.md")
SCRIPT = re.compile(r"docs/scripts/([\w./]+\.(?:py|c))")
# `docs/page.md`, "Section" (the section is a heading, a bold paragraph lead or a line's start)
SECTION = re.compile(r"docs/(\w+)\.md`?,?\s*(?:section\s*)?[\"“]([^\"”\n]+)[\"”]")


def _anchors(page: Path) -> list[str]:
    return [line.lstrip("#* \t") for line in page.read_text().splitlines()]


def test_every_cited_page_section_and_script_exists():
    anchors = {p.name: _anchors(p) for p in ROOT.glob("docs/*.md")}
    broken = []
    for src in SOURCES:
        if src == Path(__file__).resolve():
            continue
        text = src.read_text(errors="replace")
        where = src.relative_to(ROOT)
        broken += [f"{where}: {m[0]}" for m in PAGE.finditer(text) if f"{m[1]}.md" not in anchors]
        broken += [f"{where}: {m[0]}" for m in SCRIPT.finditer(text) if not (ROOT / "docs/scripts" / m[1]).exists()]
        for m in SECTION.finditer(text):
            lines = anchors.get(f"{m[1]}.md", [])
            if lines and not any(line.startswith(m[2]) for line in lines):
                broken.append(f"{where}: {m[0]}")
    assert not broken, "references that resolve to nothing:\n" + "\n".join(broken)
