"""The README and docs/: the two commands CI and users run, and every relative link (and its
#anchor) resolving in the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
PUBLISHED = ROOT / "results" / "published" / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), PUBLISHED]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"```.*?```", flags=re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), flags=re.M)
    slugs = set()
    for heading in headings:
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_readme_has_the_two_commands_and_ci_runs_the_test_one():
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = {line.strip() for block in blocks for line in block.splitlines()}
    assert "pip install -e . && pe-bench experiment=quick" in lines
    assert 'pip install -e ".[dev]" && pytest' in lines
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == 'pip install -e ".[dev]" && pytest'


def test_every_docs_page_is_linked_from_the_readme():
    linked = {target.split("#")[0] for target in links(README)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in linked, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such path)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def layout_sections() -> dict[str, str]:
    """docs/layout.md's "Packages" part cut at each package's bold heading (``**`run/`**``;
    ``**Top level**`` is the package's own modules): the text that describes each package."""
    text = (ROOT / "docs" / "layout.md").read_text()
    packages = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^\*\*(?:`([\w/]+)/`|(Top level))\*\*", packages, flags=re.M)
    sections = zip(parts[1::3], parts[3::3], strict=True)  # parts[2::3]: "Top level" or None
    return {name or "": body for name, body in sections}


def test_layout_names_every_module_in_its_package():
    """docs/layout.md is where a newcomer finds what a module does: every module of the
    package is named (by file name, in backticks) under its package's heading."""
    sections = layout_sections()
    package = ROOT / "pe_bench"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        top = rel.parts[0] if len(rel.parts) > 1 else ""
        if path.name.startswith("__") or f"`{path.name}`" in sections.get(top, ""):
            continue
        missing.append(str(rel))
    assert not missing, f"modules docs/layout.md does not name under their package: {missing}"
