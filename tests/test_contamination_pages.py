"""The report and the viewer say whether each held-out number is held out: over the lake of
tests/test_contamination.py (eval run `eval-grpo1` has 2 of its 4 tasks trained on by its policy's lineage,
`eval-base` none), the report's contamination section, the served run page of an eval run and its exported page
each carry `held_out_label`'s text, the clean success beside it, and a banner for a number that is not held out;
a run of another kind carries none. An eval run whose ids hold script payloads shows them as text only."""

from __future__ import annotations

import html

import pytest

from tests.test_contamination import _seed
from tests.viewer_helpers import Tags, payload
from trajlake.schemas.records import Episode, Policy, Run, TrainStep, Turn
from trajlake.store import Lake
from trajlake.view.markup import SCRIPT, url_part
from trajlake.view.pages import Links
from trajlake.view.report import CONTAMINATION_SQL, build_report
from trajlake.view.server import Viewer, export_site

DIRTY = "NOT CLEAN: 2 of 4 tasks trained on"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    path = tmp_path_factory.mktemp("contaminated") / "lake"
    with Lake.open(str(path)) as lk:
        _seed(lk)
    with Lake.open(str(path), read_only=True) as lk:
        yield lk


@pytest.fixture(scope="module")
def viewer(lake):
    v = Viewer(lake, port=0)
    yield v
    v.server.server_close()


def section(page: str, key: str) -> str:
    return page.split(f'<section id="{key}">', 1)[1].split("</section>", 1)[0]


def row_of(table: str, run_id: str) -> str:
    """The <tr> of a table whose first cell is `run_id`."""
    return next(r for r in table.split("<tr>") if r.startswith(f"<td>{html.escape(run_id)}</td>"))


def held_out_block(page: str) -> str:
    """What a run page shows between its title and its filters: the held-out summary, if any."""
    return page.split("</h1>", 1)[1].split('<form id="filters"', 1)[0]


# ---- the report -----------------------------------------------------------------------------------------
def test_the_report_labels_each_eval_run(lake, tmp_path):
    page = build_report(lake, tmp_path / "report").read_text()
    part = section(page, "contamination")
    assert f"<pre>{html.escape(CONTAMINATION_SQL.strip().replace('{runs}', ''))}</pre>" in part
    grpo, base = row_of(part, "eval-grpo1"), row_of(part, "eval-base")
    assert f'<td class="notclean">{DIRTY}</td>' in grpo
    # tasks, contaminated, held_out, episodes, success, clean tasks, clean episodes, clean success
    assert '<td class="num">4</td><td class="num">2</td>' in grpo and '<td class="num">0.0</td></tr>' in grpo
    assert '<td class="clean">clean</td>' in base and "NOT CLEAN" not in base
    assert '<td class="num">0.5</td></tr>' in base  # its clean success is its success
    assert "NOT CLEAN: 1 of 4 tasks trained on" in row_of(part, "eval-sft")
    assert "<script" not in page


def test_the_reports_run_filter_applies_to_the_labels(lake, tmp_path):
    part = section(build_report(lake, tmp_path / "report", runs=["eval-base"]).read_text(), "contamination")
    table = part.split("<table>", 1)[1].split("</table>", 1)[0]
    assert "eval-base" in table and "eval-grpo1" not in table and "NOT CLEAN" not in table
    assert html.escape("r.run_id IN ('eval-base')") in part


# ---- the viewer's run page ----------------------------------------------------------------------------------
def check_run_pages(grpo: str, base: str, other: str) -> None:
    """eval-grpo1's page opens with the label in a banner and its table; eval-base's reads clean; a collect
    run's page has no held-out block."""
    block = held_out_block(grpo)
    banner = block.split('<p class="notclean">', 1)[1].split("</p>", 1)[0]
    assert banner.startswith(DIRTY) and "0.50 (2 of 4 episodes)" in banner
    assert "on the 2 clean tasks: 0.00 (0 of 2 episodes)" in banner
    assert '<table id="held-out">' in block and f'<td class="notclean">{DIRTY}</td>' in block
    assert "<td>grpo/step-1</td>" in block and "<td>2</td>" in block  # the policy and its trained-on count
    block = held_out_block(base)
    assert '<td class="clean">clean</td>' in block and "NOT CLEAN" not in block
    assert block.count("0.50 (2 of 4 episodes)") == 2  # success and clean success alike
    assert "held-out" not in held_out_block(other) and "clean" not in held_out_block(other)
    for text in (grpo, base):
        parsed = Tags(text)  # the block adds no script and no handler: the CSP's hashes stand
        assert parsed.scripts == [SCRIPT] and not [a for a in parsed.attrs if a.startswith(("on", "style"))]


def test_the_served_run_page_of_an_eval_run_says_whether_it_is_held_out(viewer):
    (s1, grpo), (s2, base), (s3, other) = (viewer.render(f"/run?id={r}")
                                           for r in ("eval-grpo1", "eval-base", "grpo%2Fit-1"))
    assert (s1, s2, s3) == (200, 200, 200)
    check_run_pages(grpo, base, other)


def test_the_exported_run_page_says_it_too(lake, tmp_path):
    export_site(lake, tmp_path / "site", max_episodes=0)  # the run pages are what this is about
    read = {r: (tmp_path / "site" / "runs" / Links.page_file(r)).read_text()
            for r in ("eval-grpo1", "eval-base", "grpo/it-1")}
    check_run_pages(read["eval-grpo1"], read["eval-base"], read["grpo/it-1"])


def test_a_hostile_eval_run_shows_its_ids_as_text(tmp_path):
    """An eval run whose run id, policy, env and split are payloads, trained on its own task: the label and
    every id show escaped, and the page holds no markup from them."""
    run, policy, env = payload("eval-run"), payload("eval-policy"), payload("eval-env")
    obs = "Goal: craft " + payload("goal")
    with Lake.open(str(tmp_path / "lake")) as lake:
        lake.append({"runs": [Run("train", "train"), Run("c", "collect"), Run(run, "eval")],
                     "policies": [Policy(policy, run_id="train", step=1)],
                     "train_steps": [TrainStep("train", 1, episode_ids=("seen",))],
                     "episodes": [Episode("seen", run_id="c", policy_id="x", task_id="t", env=env, num_turns=1),
                                  Episode("ev", run_id=run, policy_id=policy, task_id="t2", env=env, num_turns=1,
                                          status="ok", success=True)],
                     "turns": [Turn("seen", 0, observation=obs), Turn("ev", 0, observation=obs)]},
                    stage="test", message="hostile eval")
        viewer = Viewer(lake, port=0)
        try:
            status, text = viewer.render("/run?id=" + url_part(run))
        finally:
            viewer.server.server_close()
    assert status == 200
    block = held_out_block(text)
    assert "NOT CLEAN: 1 of 1 tasks trained on" in block
    assert html.escape(policy) in block and html.escape(env) in block
    parsed = Tags(text)
    assert parsed.scripts == [SCRIPT] and not {"img", "svg"} & set(parsed.tags)
    assert not [a for a in parsed.attrs if a.startswith("on")]

