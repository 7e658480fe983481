"""The docs site: it builds strictly (every link and anchor resolves), every page is in its nav, the README
stays a short front page, no page tells the project's own history, and the files the pages name exist.
(tests/test_readme.py runs the pages' commands.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.docs_pages import DOCS, ROOT, nav_pages, pages

README_MAX_LINES = 150

#: words that tell the project's history rather than describe what it does
HISTORY = re.compile(r"\b(now|used to|was fixed|session|issues?|formerly|previously|anymore)\b", re.I)

#: a repository path named in a code span: a folder and a file with an extension trajlake ships
NAMED_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|toml|sql|md))`")


def test_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(site)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    for page in ("index.html", "getting-started.html", "results.html", "queries/index.html"):
        assert (site / page).is_file(), f"the site has no {page}"
    assert "make demo" in (site / "getting-started.html").read_text()


def test_every_docs_page_is_in_the_nav():
    nav = set(nav_pages())
    left_out = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in nav]
    assert not left_out, f"docs pages missing from mkdocs.yml's nav: {left_out}"


def test_readme_is_a_short_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"


def test_readme_and_site_show_the_same_layout():
    def layout(path: Path) -> str:
        return re.search(r"^## Layout.*?\n(```text\n.*?^```)", path.read_text(), flags=re.S | re.M).group(1)

    assert layout(ROOT / "README.md") == layout(DOCS / "index.md")


def test_no_page_tells_the_projects_history():
    told = []
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            told += [f"{page.relative_to(ROOT)}:{n}: {m.group(0)!r}" for m in HISTORY.finditer(line)]
    assert not told, "pages should say what trajlake does, not its history: " + "; ".join(told)


def test_the_files_the_pages_name_exist():
    missing = []
    for page in pages():
        for name in NAMED_PATH.findall(page.read_text()):
            if not name.startswith("../") and not (ROOT / name).exists():
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, f"pages name files the repository does not have: {missing}"
