"""The viewer's train run pages (issue 27): over a lake with a real SFT and a real GRPO run from it (in-training
evals before the first iteration and after each), the run list puts the train runs first with their sparklines
and their iteration and eval runs under them; a train run's page draws its curves and eval success, lists its
config against the defaults stored with it, its policies with their parents, its steps with what each trained on;
its evals compare on the same tasks; every link leads to a page; the export writes the same pages (byte for
byte, as the per-page path renders them); and in a real browser, served and exported, the charts are there,
the links resolve and the policy refuses nothing."""

from __future__ import annotations

import html
import re
from urllib.parse import unquote, urlsplit

import pytest

from tests.viewer_helpers import Tags, csp_refusals, open_browser, served, train_lake_uri
from trajlake.evaluate.metrics import wilson_interval
from trajlake.schemas.records import Run
from trajlake.store import Lake
from trajlake.store.reads import latest_spec
from trajlake.view.markup import SCRIPT
from trajlake.view.pages import Links, Pages
from trajlake.view.server import Viewer, export_site


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    with Lake.open(train_lake_uri(tmp_path_factory), read_only=True) as lk:
        yield lk


@pytest.fixture(scope="module")
def viewer(lake):
    with served(lake) as v:
        yield v


@pytest.fixture(scope="module")
def site(lake, tmp_path_factory):
    out = tmp_path_factory.mktemp("train-site") / "site"
    export_site(lake, out, progress=False)
    return out


def ok(viewer, path: str) -> str:
    status, text = viewer.render(path)
    assert status == 200, (path, text)
    return text


def chart_titles(text: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'<svg class="chart"[^>]*><title>(.*?)</title>', text)]


def hrefs(text: str) -> list[str]:
    return [dict(a)["href"] for tag, a in Tags(text).elements if tag == "a" and dict(a).get("href", "#") != "#"]


# ---- the pages ----------------------------------------------------------------------------------------------
def test_the_run_list_shows_train_runs_first_with_their_runs_under_them(viewer):
    text = ok(viewer, "/")
    rows = re.findall(r'<tr(?: class="([^"]*)")? data-run="([^"]*)">', text)
    order = [run for _, run in rows]
    assert order[:2] == ["sft", "grpo"]  # the train runs, first
    under = order[2:order.index("expert")]  # then grpo's own runs, before the other kinds
    assert set(under) == {"grpo/it-1", "grpo/it-2", "grpo/eval-0", "grpo/eval-1", "grpo/eval-2"}
    assert all(cls.startswith("child") for cls, run in rows if run in under)
    assert '<a href="/train?id=grpo' in text and '<a href="/train?id=sft' in text
    grpo = text.split('data-run="grpo">', 1)[1].split("</tr>", 1)[0]
    assert '<svg class="spark"' in grpo and "success" in grpo  # GRPO's main metric: the rollouts' success
    sft = text.split('data-run="sft">', 1)[1].split("</tr>", 1)[0]
    assert '<svg class="spark"' in sft and "loss" in sft
    assert text.index(">train runs (2)<") < text.index(">collect runs (1)<")


def test_the_grpo_page_draws_its_curves_and_evals(viewer, lake):
    text = ok(viewer, "/train?id=grpo")
    titles = chart_titles(text)
    assert titles[:7] == ["reward (batch mean)", "success (sampled rollouts on train tasks)",
                          "eval success, greedy (Wilson 95%)", "groups whose samples differ in success (share)",
                          "loss", "entropy", "response length (agent tokens per episode)"]  # no KL: kl_coef 0
    assert "grad_norm" in titles and "pg_clipfrac" in titles  # the others, folded
    evals_chart = text.split("<title>eval success, greedy (Wilson 95%)</title>", 1)[1].split("</svg>", 1)[0]
    assert evals_chart.count("<circle") == 3 and evals_chart.count("<path") == 3  # steps 0-2, each its interval
    assert "step 0: 0" in evals_chart and "grpo/eval-0, sft/step-2" in evals_chart
    # its evals beside: the start's (in-training eval before the first iteration) and its own checkpoints'
    table = text.split('<table id="train-evals-0"', 1)[1].split("</table>", 1)[0]
    roles = re.findall(r'data-run="([^"]*)" data-role="([^"]*)"', table)
    assert roles == [("grpo/eval-0", "start"), ("grpo/eval-1", "own"), ("grpo/eval-2", "own")]
    for run in ("grpo/eval-0", "grpo/eval-1", "grpo/eval-2"):  # each success with Wilson's interval
        n, won = lake.query("SELECT count(*), count(*) FILTER (WHERE success) FROM episodes WHERE run_id = ? "
                            "AND status IS DISTINCT FROM 'error'", [run]).row(0)
        lo, hi = wilson_interval(won, n)
        assert f"{won / n:.2f} [{lo:.2f}, {hi:.2f}] ({won} of {n})" in table.split(f'data-run="{run}"', 1)[1]
    # config: what differs from the defaults stored with the run first, the rest folded (config_defaults is no row)
    differs = text.split('<table id="config">', 1)[1].split("</table>", 1)[0]
    assert "<td>model</td><td><code>run:sft</code></td><td><code>(required)</code></td>" in differs
    assert "<td>iterations</td><td><code>2</code></td><td><code>10</code></td>" in differs
    assert '<tr class="recorded"><td>start_policy</td><td><code>sft/step-2</code>' in differs
    assert "<td>algo</td>" not in differs and "<td>algo</td>" in text.split('id="config-defaults"', 1)[1]
    assert "config_defaults" not in text
    # policies with their parents, back to the base model
    policies = dict(re.findall(r'data-policy="([^"]*)" data-role="([^"]*)"', text))
    tiny = lake.query("SELECT parent_policy_id FROM policies WHERE policy_id = 'sft/step-1'").item()
    assert policies == {"grpo/step-1": "own", "grpo/step-2": "own", "sft/step-2": "start", "sft/step-1": "ancestor",
                        tiny: "ancestor"}
    # steps: what each trained on, and the collect run it came from
    steps = text.split('<table id="steps">', 1)[1].split("</table>", 1)[0]
    assert '<a href="/trained?id=grpo&amp;step=1' in steps and '<a href="/run?id=grpo%2Fit-1' in steps
    assert "grpo/it-1</a> (4)" in steps and "grpo/it-2</a> (4)" in steps
    assert '<p id="children">' in text


def test_the_sft_page_and_a_run_without_steps(viewer, tmp_path):
    text = ok(viewer, "/train?id=sft")
    assert chart_titles(text)[:2] == ["eval success, greedy (Wilson 95%)", "loss"] and "nll" in chart_titles(text)
    # its last checkpoint's eval is GRPO's before its first iteration (its start): on the SFT's curve at step 2
    assert "step 2: " in text.split("<title>eval success, greedy (Wilson 95%)</title>", 1)[1].split("</svg>", 1)[0]
    assert "expert</a> (4)" in text  # each row trained on the expert's 4 episodes
    assert ok(viewer, "/run?id=sft") == text  # a train run's run page is its train page
    # a train run whose process died before its first step: the page says so
    with Lake.open(str(tmp_path / "lake")) as lk:
        lk.append({"runs": [Run("fresh", "train", config={"model": "m"}, status="running")]}, stage="train")
        v = Viewer(lk, port=0)
        try:
            page = ok(v, "/train?id=fresh")
        finally:
            v.server.server_close()
    assert 'id="no-steps">no steps recorded' in page and 'id="no-evals"' in page and not chart_titles(page)
    assert "<td>model</td><td><code>m</code></td>" in page


def test_the_evals_page_compares_on_the_same_tasks(viewer, lake):
    text = ok(viewer, "/evals?id=grpo")
    assert "<h1>evals of grpo</h1>" in text
    section = text.split('<section class="evalgroup" id="group-0" data-env="doors" data-split="test">', 1)[1]
    assert section.count("<tr data-task=") == 2  # the 2 held-out tasks
    assert 'id="wins-0"' in section  # 3 evals: the better / worse matrix
    eids = set(lake.query("SELECT episode_id FROM episodes WHERE run_id LIKE 'grpo/eval-%'")["episode_id"].to_list())
    linked = {unquote(h.split("id=", 1)[1].split("&", 1)[0]) for h in hrefs(section) if h.startswith("/episode?")}
    assert linked == eids
    assert "grpo/eval-2</a>" in section and "against sft/step-2 (start)" in section
    pair = ok(viewer, "/evals?a=grpo%2Feval-0&b=grpo%2Feval-2")
    assert pair.count("<tr data-task=") == 2 and 'data-role="a"' in pair and 'data-role="b"' in pair


def test_the_trained_on_page_lists_a_steps_episodes(viewer, lake):
    text = ok(viewer, "/trained?id=grpo&step=1")
    ids = lake.query("SELECT episode_id FROM episodes WHERE run_id = 'grpo/it-1' ORDER BY 1")["episode_id"].to_list()
    assert re.findall(r'<tr data-id="([^"]*)"', text) == ids
    assert "4 episodes, from" in text and "grpo/it-1</a> (4)" in text
    assert Tags(text).scripts == [SCRIPT]
    sft = ok(viewer, "/trained?id=sft&step=2")
    assert len(re.findall(r"<tr data-id=", sft)) == 4


@pytest.mark.parametrize("path, named", [("/train?id=nope", "no train run 'nope'"),
                                         ("/train?id=expert", "no train run 'expert'"),
                                         ("/evals?id=nope", "no train run 'nope'"),
                                         ("/evals?a=grpo%2Feval-0&b=nope", "no eval run 'nope'"),
                                         ("/evals?a=expert&b=grpo%2Feval-0", "no eval run 'expert'"),
                                         ("/trained?id=grpo&step=7", "no step 7 of train run 'grpo'"),
                                         ("/trained?id=grpo&step=-1", "no step '-1'"),
                                         ("/trained?id=grpo", "no step None"),
                                         ("/trained?id=nope&step=1", "no step 1 of train run 'nope'")])
def test_unknown_pages_are_404s_naming_what_was_asked(viewer, path, named):
    status, text = viewer.render(path)
    assert status == 404 and html.escape(named) in text


def test_every_link_of_the_new_pages_leads_to_a_page(viewer):
    seen = set()
    for path in ("/", "/train?id=grpo", "/train?id=sft", "/evals?id=grpo", "/trained?id=grpo&step=2"):
        for h in hrefs(ok(viewer, path)):
            if h not in seen:
                seen.add(h)
                assert viewer.render(h)[0] == 200, (path, h)
    assert any(h.startswith("/trained?") for h in seen) and any(h.startswith("/evals?") for h in seen)


# ---- the export ---------------------------------------------------------------------------------------------
def test_the_export_writes_the_train_pages_as_the_per_page_path_renders_them(lake, site):
    pages = Pages(lake, lake.current_snapshot(), latest_spec(lake), Links(static=True))
    for run in ("sft", "grpo"):
        assert (site / "train" / Links.page_file(run)).read_text() == pages.train(run)
        assert (site / "evals" / Links.page_file(run)).read_text() == pages.evals(run)
    steps = lake.query("SELECT run_id, step FROM train_steps WHERE episode_ids IS NOT NULL").rows()
    assert {p.name for p in (site / "trained").iterdir()} == {Links.trained_file(r, s) for r, s in steps}
    for run, step in steps:
        assert (site / "trained" / Links.trained_file(run, step)).read_text() == pages.trained(run, step)
    assert (site / "index.html").read_text() == pages.runs()


def test_served_and_exported_pages_differ_only_in_their_links(viewer, site):
    """The train and evals pages are the same bytes served and exported but for where their links point."""
    def unlinked(text: str) -> str:
        return re.sub(r'href="[^"]*"', 'href=""', text)

    for folder, path in (("train", "/train?id=grpo"), ("evals", "/evals?id=grpo"), ("train", "/train?id=sft")):
        run = path.split("id=", 1)[1]
        assert unlinked(ok(viewer, path)) == unlinked((site / folder / Links.page_file(run)).read_text()), path


def test_every_exported_link_resolves_to_a_file(site):
    pages = [site / "index.html", *(site / "train").iterdir(), *(site / "evals").iterdir(),
             *list((site / "trained").iterdir())[:2]]
    for p in pages:
        for h in hrefs(p.read_text()):
            target = (p.parent / unquote(urlsplit(h).path)).resolve()
            assert target.is_file(), (p.name, h)


# ---- in a browser -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    b = open_browser()
    yield b
    b.quit()


def check_train_page(browser, run: str) -> None:
    from selenium.webdriver.common.by import By

    assert browser.title == f"train {run}"
    charts = browser.find_elements(By.CSS_SELECTOR, "#curves > .charts svg.chart")
    assert len(charts) >= 4 and all(c.is_displayed() and c.size["width"] > 100 for c in charts)
    points = browser.find_elements(By.CSS_SELECTOR, "#curves svg.chart circle")
    assert points and points[0].find_element(By.TAG_NAME, "title").get_attribute("textContent").startswith("reward")
    assert browser.find_elements(By.CSS_SELECTOR, "#evals svg.chart")  # the evals, beside the curves
    assert csp_refusals(browser) == []


def walk(browser) -> None:
    """From the run list: the GRPO run's page, its evals, an episode of them; back, a step's episodes."""
    from selenium.webdriver.common.by import By

    browser.find_element(By.LINK_TEXT, "grpo").click()
    check_train_page(browser, "grpo")
    train_url = browser.current_url
    browser.find_element(By.LINK_TEXT, "compare them task by task").click()
    assert browser.title == "evals of grpo" and csp_refusals(browser) == []
    cells = browser.find_elements(By.CSS_SELECTOR, "table.tasks td a")
    assert len(cells) == 2 * 3
    cells[0].click()
    assert browser.title.startswith("episode ") and browser.find_elements(By.CSS_SELECTOR, ".turn")
    browser.get(train_url)
    browser.find_element(By.CSS_SELECTOR, "#steps a[href*='trained']").click()
    assert browser.title == "train grpo step 1"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 4
    browser.find_element(By.LINK_TEXT, "train run grpo").click()
    assert browser.title == "train grpo"
    browser.find_element(By.LINK_TEXT, "runs").click()
    assert browser.title == "trajlake runs"
    browser.find_element(By.LINK_TEXT, "sft").click()
    assert browser.title == "train sft" and browser.find_elements(By.CSS_SELECTOR, "#curves svg.chart")
    assert csp_refusals(browser) == []


def test_served_train_pages_in_a_browser(browser, viewer):
    browser.get(viewer.url)
    spark = browser.find_element("css selector", "tr[data-run='grpo'] svg.spark")
    assert spark.is_displayed()
    walk(browser)


def test_exported_train_pages_in_a_browser(browser, site):
    browser.get((site / "index.html").as_uri())
    walk(browser)
