"""The report's links into the viewer, and its page, over the hostile lake of the viewer tests (payloads in
every field, ids with quotes, `../` and `%`): the report is written without a traceback (plot titles that
matplotlib would read as math), holds no script or handler from the data, links each extreme episode by its
quoted id to a viewer page that exists, and in a browser its plots load under its policy and nothing runs."""

from __future__ import annotations

import html
from urllib.parse import urlsplit

import pytest

from tests.viewer_helpers import SPEC_NAME, Tags, build_hostile_lake, csp_refusals, open_browser
from trajlake.store import Lake
from trajlake.view.report import CSP, build_report
from trajlake.view.server import Viewer

VIEWER = "http://127.0.0.1:9/"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile-report")
    build_hostile_lake(path / "lake")
    with Lake.open(str(path / "lake"), read_only=True) as lake:
        yield lake, build_report(lake, path / "report", viewer_url=VIEWER)


def test_the_report_holds_no_markup_from_the_data(report):
    _, index = report
    text = index.read_text()
    parsed = Tags(text)
    assert "script" not in parsed.tags and not [a for a in parsed.attrs if a.startswith("on")]
    assert {"svg", "iframe", "object", "embed", "base"}.isdisjoint(parsed.tags)
    assert f'content="{html.escape(CSP)}"' in text
    assert html.escape(SPEC_NAME) in text  # shown, as text


def test_its_viewer_links_quote_the_ids_and_lead_to_pages(report):
    lake, index = report
    hrefs = [h for tag, attrs in Tags(index.read_text()).elements if tag == "a"
             for name, h in attrs if name == "href" and h.startswith(VIEWER)]
    assert hrefs, "the rewards and turns sections link their extremes"
    viewer = Viewer(lake, port=0)
    try:
        for href in hrefs:  # the parser has unescaped the attribute: this is the URL a browser follows
            url = urlsplit(href)
            assert not set("'\"<> ") & set(href), href  # every reserved character percent-encoded
            assert viewer.render(url.path + "?" + url.query)[0] == 200, href
    finally:
        viewer.server.server_close()


def test_the_report_in_a_browser_loads_its_plots_and_runs_nothing(report):
    _, index = report
    browser = open_browser()
    try:
        browser.get(index.as_uri())
        assert browser.title == "trajlake report"
        assert browser.execute_script("return window.__xss === undefined")
        sizes = browser.execute_script("return [...document.images].map(i => i.naturalWidth)")
        assert sizes and all(w > 0 for w in sizes)  # the policy lets the page's own plots load
        assert csp_refusals(browser) == []
        assert SPEC_NAME in browser.find_element("tag name", "body").text
    finally:
        browser.quit()
