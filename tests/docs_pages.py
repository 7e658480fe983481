"""The pages of the README and the docs site, in the site's order, and their fenced blocks (for
tests/test_readme.py, which runs the blocks, and tests/test_docs.py, which builds the site)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Block:
    """One fenced block: the page it is on (relative to the repository), its language tag and its text."""

    page: str
    kind: str
    body: str


def nav_pages() -> list[str]:
    """The pages of mkdocs.yml's nav, in order, as paths relative to docs/."""

    def flatten(nav: list) -> list[str]:
        found: list[str] = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += flatten(value) if isinstance(value, list) else [value]
        return found

    return flatten(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def pages() -> list[Path]:
    """README.md, then the docs pages in the site's nav order, then those the nav leaves out (sorted)."""
    nav = [DOCS / p for p in nav_pages()]
    rest = sorted(p for p in DOCS.rglob("*.md") if p not in nav)
    return [ROOT / "README.md", *nav, *rest]


def blocks() -> list[Block]:
    """Every fenced block with a language tag, page by page in the site's order."""
    return [Block(str(page.relative_to(ROOT)), kind, body)
            for page in pages()
            for kind, body in re.findall(r"^```(\w+)\n(.*?)^```", page.read_text(), flags=re.S | re.M)]


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
