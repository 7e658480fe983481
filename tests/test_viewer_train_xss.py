"""The train run, eval comparison and trained-on pages against hostile data (tests/viewer_helpers.py's hostile
train lake: the run id, its config's keys and values, a metric name, the policies, eval runs, env, split and
task ids all script payloads). Served and exported, the pages hold their own script only, their charts only
drawing elements (no handler, no link, nothing loaded), every payload shown as text; in a real browser nothing
runs and the policy refuses nothing; unknown ids are 404s that name them escaped."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from urllib.parse import quote

import pytest

from tests.test_viewer_xss import assert_inert, body_text
from tests.viewer_helpers import (
    CHECKPOINT,
    CONFIG_KEY,
    CONFIG_VALUE,
    ENV,
    EVAL_A,
    EVAL_B,
    ITERATION,
    METRIC,
    SPLIT,
    START,
    TRAIN_RUN,
    TRAIN_TASKS,
    UNKNOWN,
    Tags,
    build_hostile_train_lake,
    open_browser,
    payload,
    served,
)
from trajlake.store import Lake
from trajlake.view.markup import CSP, SCRIPT
from trajlake.view.pages import Links
from trajlake.view.server import export_site

#: what a chart may hold (view/charts.py): drawing elements, nothing that runs, loads or links
SVG_ELEMENTS = {"svg", "title", "text", "line", "polyline", "circle", "path", "g"}


def q(value: str) -> str:
    return quote(value, safe="")


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile-train") / "lake"
    build_hostile_train_lake(path)
    with Lake.open(str(path), read_only=True) as lk:
        yield lk


@pytest.fixture(scope="module")
def viewer(lake):
    with served(lake) as v:
        yield v


PAGES = {"/": "trajlake runs", f"/train?id={q(TRAIN_RUN)}": f"train {TRAIN_RUN}",
         f"/evals?id={q(TRAIN_RUN)}": f"evals of {TRAIN_RUN}",
         f"/trained?id={q(TRAIN_RUN)}&step=1": f"train {TRAIN_RUN} step 1",
         f"/evals?a={q(EVAL_A)}&b={q(EVAL_B)}": f"evals {EVAL_A} and {EVAL_B}"}


def assert_own_markup(text: str, where: str) -> None:
    """One <script>, the page's own; no element or handler from a payload; every <svg> well-formed and only
    drawing elements."""
    parsed = Tags(text)
    assert parsed.scripts == [SCRIPT] and parsed.tags.count("script") == 1, where
    assert not {"img", "iframe", "object", "embed", "base", "foreignobject", "use", "image"} & set(parsed.tags), where
    assert not [a for a in parsed.attrs if a.startswith("on")], where
    chunks = text.split("<svg")[1:]
    for chunk in chunks:
        svg = ET.fromstring("<svg" + chunk.split("</svg>", 1)[0] + "</svg>")
        for el in svg.iter():
            assert el.tag.split("}")[-1] in SVG_ELEMENTS, (where, el.tag)
            assert not [a for a in el.attrib if a.lower().startswith("on") or "href" in a.lower()], where


def test_served_pages_hold_only_their_own_markup_and_show_the_payloads(viewer):
    for path in PAGES:
        status, text = viewer.render(path)
        assert status == 200, path
        assert_own_markup(text, path)
    train = viewer.render(f"/train?id={q(TRAIN_RUN)}")[1]
    for shown in (TRAIN_RUN, CONFIG_KEY, CONFIG_VALUE, METRIC, START, CHECKPOINT, ITERATION, EVAL_A, EVAL_B,
                  payload("model"), payload("checkpoint-uri"), payload("code"), ENV, SPLIT):
        assert html.escape(shown) in train, shown
    assert f"<title>{html.escape(METRIC)}</title>" in train  # the metric's own chart, its name as text
    evals = viewer.render(f"/evals?id={q(TRAIN_RUN)}")[1]
    for shown in TRAIN_TASKS + [EVAL_A, EVAL_B, START, CHECKPOINT]:
        assert html.escape(shown) in evals, shown
    assert "better on 1</b>, <b class=\"loss\">worse on 1</b>" in evals  # one task each way


def test_exported_pages_hold_only_their_own_markup(lake, tmp_path):
    export_site(lake, tmp_path / "site", progress=False)
    pages = list((tmp_path / "site").rglob("*.html"))
    names = {p.relative_to(tmp_path / "site").parts[0] for p in pages}
    assert names == {"index.html", "runs", "episodes", "train", "evals", "trained"}
    for p in pages:
        text = p.read_text()
        assert_own_markup(text, p.name)
        assert f'content="{html.escape(CSP)}"' in text
    assert len(list((tmp_path / "site" / "trained").iterdir())) == 2
    assert all(p.resolve().is_relative_to((tmp_path / "site").resolve()) for p in pages)


def test_unknown_ids_are_404s_that_name_them_escaped(viewer):
    u = q(UNKNOWN)
    for path in (f"/train?id={u}", f"/evals?id={u}", f"/evals?a={u}&b={q(EVAL_A)}", f"/evals?a={q(EVAL_A)}&b={u}",
                 f"/trained?id={u}&step=1", f"/trained?id={q(TRAIN_RUN)}&step={u}", f"/train/{u}"):
        status, text = viewer.render(path)
        assert status == 404, path
        assert_own_markup(text, path)
        assert html.escape(repr(UNKNOWN)) in text or html.escape(repr(UNKNOWN)[1:-1]) in text, path


# ---- in a browser ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    b = open_browser()
    yield b
    b.quit()


def test_served_pages_run_nothing_in_a_browser(browser, viewer):
    from selenium.webdriver.common.by import By

    for path, title in PAGES.items():
        browser.get(viewer.url + path.lstrip("/"))
        assert_inert(browser, title)
    browser.get(viewer.url + f"train?id={q(TRAIN_RUN)}")
    text = body_text(browser)
    assert TRAIN_RUN in text and CONFIG_KEY in text and CONFIG_VALUE in text
    folded = browser.find_element(By.ID, "other-metrics").get_attribute("textContent")  # the folded charts
    assert METRIC in folded
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    browser.find_element(By.LINK_TEXT, "its evals compared").click()  # the hostile id's link, quoted
    assert_inert(browser, f"evals of {TRAIN_RUN}")
    browser.find_element(By.CSS_SELECTOR, "table.tasks td a").click()
    assert browser.title.startswith("episode ")
    assert_inert(browser, browser.title)


def test_exported_pages_run_nothing_in_a_browser(browser, lake, tmp_path):
    from selenium.webdriver.common.by import By

    export_site(lake, tmp_path / "site", progress=False)
    browser.get((tmp_path / "site" / "index.html").as_uri())
    assert_inert(browser, "trajlake runs")
    browser.find_element(By.LINK_TEXT, TRAIN_RUN).click()  # the train run's link names its encoded file
    assert_inert(browser, f"train {TRAIN_RUN}")
    assert TRAIN_RUN in body_text(browser)
    browser.find_element(By.CSS_SELECTOR, "#steps a[href*='trained']").click()
    assert_inert(browser, f"train {TRAIN_RUN} step 1")
    browser.get((tmp_path / "site" / "evals" / Links.page_file(TRAIN_RUN)).as_uri())
    assert_inert(browser, f"evals of {TRAIN_RUN}")
    for cell in browser.find_elements(By.CSS_SELECTOR, "table.tasks td a")[:1]:
        cell.click()
        assert_inert(browser, browser.title)
