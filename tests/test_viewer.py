"""The trajectory viewer (view/server.py, `trajlake view`): its pages over a real lake (the cookbook's demo
lake: a model's and a scripted expert's episodes on doors, scored under two specs), served and exported, and in
a real browser (Debian's chromium with chromedriver, through selenium): pages load, filters work, and the token
shading of a known episode matches `token_rewards`. The browser tests skip, saying why, where no browser is
installed; CI installs one."""

from __future__ import annotations

import pytest

from tests.helpers import EXPERT, demo_lake_uri
from tests.viewer_helpers import csp_refusals, open_browser, served
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.view.server import Viewer, export_site


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    with Lake.open(demo_lake_uri(tmp_path_factory), read_only=True) as lake:
        yield lake


@pytest.fixture(scope="module")
def viewer(lake):
    with served(lake) as v:
        yield v


def a_model_episode(lake) -> tuple[str, str]:
    """(episode id, spec id) of a tiny-model episode with non-zero allocated token rewards."""
    return lake.query("SELECT k.episode_id, k.spec_id FROM token_rewards k JOIN episodes e USING (episode_id) "
                      "WHERE e.run_id = 'collect-tiny' AND k.reward != 0 ORDER BY 1, 2 LIMIT 1").row(0)


def test_pages_render_and_unknown_ones_are_404(viewer, lake):
    status, runs = viewer.render("/")
    assert status == 200 and "collect-expert" in runs and "collect-tiny" in runs
    status, run = viewer.render("/run/collect-expert")
    assert status == 200 and run.count('<tr data-id=') == lake.query(
        "SELECT count(*) FROM episodes WHERE run_id = 'collect-expert'").item()
    eid, spec = a_model_episode(lake)
    status, ep = viewer.render(f"/episode/{eid}?spec={spec}")
    assert status == 200 and 'class="tok"' in ep and 'data-turn="0"' in ep
    status, both = viewer.render(f"/compare?a={eid}&b={eid}&spec_b={spec}")
    assert status == 200 and 'id="left"' in both and 'id="right"' in both
    assert viewer.render("/run/nope")[0] == 404 and viewer.render("/episode/nope")[0] == 404
    assert viewer.render("/elsewhere")[0] == 404


def test_static_export_writes_every_page(lake, tmp_path):
    n = export_site(lake, tmp_path / "site")
    assert n == lake.count("episodes") and (tmp_path / "site" / "index.html").is_file()
    assert len(list((tmp_path / "site" / "episodes").glob("*.html"))) == n
    assert (tmp_path / "site" / "runs" / "collect-tiny.html").is_file()
    with pytest.raises(TrajlakeError, match="not a snapshot of the lake"):
        export_site(lake, tmp_path / "other", snapshot=10_000)


def test_a_taken_port_is_one_clear_error(viewer, lake):
    port = viewer.server.server_address[1]
    with pytest.raises(TrajlakeError, match=f"cannot serve on 127.0.0.1:{port}: .*give another --port"):
        Viewer(lake, port=port)


# ---- in a browser -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    b = open_browser()
    yield b
    b.quit()


def shown(browser) -> int:
    from selenium.webdriver.common.by import By

    return sum(1 for r in browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr") if r.is_displayed())


def check_run_page_filters(browser, lake, run_id: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    total = lake.query("SELECT count(*) FROM episodes WHERE run_id = ?", [run_id]).item()
    wins = lake.query("SELECT count(*) FROM episodes WHERE run_id = ? AND success", [run_id]).item()
    assert shown(browser) == total
    Select(browser.find_element(By.NAME, "success")).select_by_visible_text("true")
    assert shown(browser) == wins and browser.find_element(By.ID, "shown").text == str(wins)
    Select(browser.find_element(By.NAME, "success")).select_by_visible_text("all")
    browser.find_element(By.NAME, "min_reward").send_keys("1000")  # no reward that high
    assert shown(browser) == 0
    box = browser.find_element(By.NAME, "min_reward")
    box.send_keys(*["\b"] * 4)  # deleted key by key, as a user does
    assert box.get_attribute("value") == "" and shown(browser) == total


def check_token_shading(browser, lake, eid: str, spec: str) -> None:
    from selenium.webdriver.common.by import By

    want = {p: r for p, r in lake.query("SELECT position, reward FROM token_rewards WHERE spec_id = ? AND "
                                        "episode_id = ?", [spec, eid]).rows()}
    spans = browser.find_elements(By.CSS_SELECTOR, "span.tok")
    n_agent = lake.query("SELECT num_agent_tokens FROM episodes WHERE episode_id = ?", [eid]).item()
    assert len(spans) == n_agent
    got = {int(s.get_attribute("data-position")): float(s.get_attribute("data-reward")) for s in spans}
    assert {p: r for p, r in got.items() if r} == pytest.approx({p: r for p, r in want.items() if r})
    for s in spans:
        colored = s.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        assert colored == bool(got[int(s.get_attribute("data-position"))])


def test_served_pages_in_a_browser(browser, viewer, lake):
    from selenium.webdriver.common.by import By

    browser.get(viewer.url)
    assert browser.title == "trajlake runs"
    browser.find_element(By.LINK_TEXT, "collect-expert").click()
    assert browser.title == "run collect-expert"
    check_run_page_filters(browser, lake, "collect-expert")
    eid, spec = a_model_episode(lake)
    browser.get(f"{viewer.url}episode/{eid}?spec={spec}")
    check_token_shading(browser, lake, eid, spec)
    assert browser.find_element(By.ID, "reward").get_attribute("data-spec") == spec
    assert csp_refusals(browser) == []  # the pages' own script and style pass their policy


def test_exported_pages_in_a_browser(browser, lake, tmp_path):
    from selenium.webdriver.common.by import By

    eid, spec = a_model_episode(lake)
    export_site(lake, tmp_path / "site", spec=spec)
    browser.get((tmp_path / "site" / "index.html").as_uri())
    browser.find_element(By.LINK_TEXT, "collect-tiny").click()
    check_run_page_filters(browser, lake, "collect-tiny")
    browser.find_element(By.CSS_SELECTOR, f"tr[data-id='{eid}'] a").click()
    check_token_shading(browser, lake, eid, spec)
    assert EXPERT not in browser.page_source
    assert csp_refusals(browser) == []
