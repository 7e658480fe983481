"""view.report.build_report: the HTML page and plots over the demo lake of tests/test_cookbook.py, an
empty lake, the `runs` filter, and bad arguments."""

from __future__ import annotations

import html

import pytest

from tests.helpers import EXPERT, TRAIN_RUN, demo_lake_uri
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Run, TrainStep
from trajlake.store import Lake
from trajlake.view.report import SECTIONS, build_report
from trajlake.view.train_data import steps_query, train_ids

PLOTS = ("learning", "kl", "rewards", "turns")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    lake = Lake.open(demo_lake_uri(tmp_path_factory))
    yield lake
    lake.close()


def section(page: str, key: str) -> str:
    return page.split(f'<section id="{key}">', 1)[1].split("</section>", 1)[0]


def test_report_shows_every_section_with_its_query(demo, tmp_path):
    index = build_report(demo, tmp_path / "report")
    assert index == tmp_path / "report" / "index.html"
    page = index.read_text()
    assert "no data yet" not in page
    for key, (title, _, sql, _) in SECTIONS.items():
        part = section(page, key)
        assert html.escape(title) in part
        shown = steps_query(train_ids(demo, demo.current_snapshot())) if sql is None else sql.replace("{runs}", "")
        assert f"<pre>{html.escape(shown.strip())}</pre>" in part, key
    for key in PLOTS:
        png = tmp_path / "report" / f"{key}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000
        assert f'<img src="{key}.png"' in section(page, key)  # relative: the folder can be moved
    table = section(page, "policies")
    assert "<table>" in table and html.escape(EXPERT) in table and "format_error_rate" in table
    assert f"snapshot {demo.current_snapshot()}" in page
    assert "<script" not in page


def test_runs_filter_restricts_train_plots_and_eval_table(demo, tmp_path):
    page = build_report(demo, tmp_path / "r", runs=[TRAIN_RUN]).read_text()
    table = section(page, "policies")
    assert html.escape(EXPERT) not in table, "eval-expert is neither the run asked for nor its child"
    assert "<td>hf:" in table, "the train run's own eval run is shown"
    assert html.escape(f"run_id IN ('{TRAIN_RUN}')") in section(page, "learning")
    assert (tmp_path / "r" / "learning.png").stat().st_size > 0

    page = build_report(demo, tmp_path / "r", runs=["eval-expert"]).read_text()  # the same folder again
    assert "no data yet: train steps" in section(page, "learning")
    assert not (tmp_path / "r" / "learning.png").exists(), "a stale plot was left behind"
    assert html.escape(EXPERT) in section(page, "policies")


def test_empty_lake_gets_notes_not_plots(tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        index = build_report(lake, tmp_path / "out" / "nested")
    page = index.read_text()
    assert page.count('<p class="empty">no data yet: ') == len(SECTIONS)
    assert "trajlake train" in section(page, "learning") and "trajlake rewards" in section(page, "rewards")
    assert "trajlake evaluate" in section(page, "policies")
    assert sorted(p.name for p in index.parent.iterdir()) == ["index.html"]


def test_bad_arguments(demo, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrajlakeError, match="is a file"):
        build_report(demo, tmp_path / "file")
    with pytest.raises(TrajlakeError, match="cannot create report folder"):
        build_report(demo, tmp_path / "file" / "sub")
    with pytest.raises(TrajlakeError, match=r"unknown run id\(s\): nope, n'o"):
        build_report(demo, tmp_path / "out", runs=[TRAIN_RUN, "nope", "n'o"])
    assert not (tmp_path / "out").exists(), "nothing is written for a refused report"


def test_cli_report(tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "lake")  # its own lake: the module's demo lake stays open in this process
    with Lake.open(uri) as lake:
        lake.append({"runs": [Run("r1", "train", status="finished")],
                     "train_steps": [TrainStep("r1", s, None, 1, {"success_mean": s / 4, "reward_mean": s / 4})
                                     for s in range(1, 4)]}, stage="test", run_id="r1")
    assert main(["--lake", uri, "report", "--out", str(tmp_path / "r"), "--runs", "r1"]) == 0
    assert "report: " in capsys.readouterr().out and (tmp_path / "r" / "learning.png").is_file()
    assert main(["--lake", uri, "report", "--out", str(tmp_path / "r"), "--runs", "no-such-run"]) == 1
    assert "no-such-run" in capsys.readouterr().err


def test_plots_link_their_worst_and_best_episodes_to_the_viewer(demo, tmp_path):
    """Each reward spec's lowest and highest total, each env's longest failure and shortest success, each
    evaluated policy's failure and success: links to the viewer's page of that episode, which renders it."""
    import re

    from trajlake.view.server import Viewer

    page = build_report(demo, tmp_path / "report", viewer_url="http://127.0.0.1:9/").read_text()
    rewards = section(page, "rewards")
    for spec_id, in demo.query("SELECT spec_id FROM reward_specs").rows():
        low, high = demo.query("SELECT arg_min(episode_id, total), arg_max(episode_id, total) FROM episode_rewards "
                               "WHERE spec_id = ?", [spec_id]).row(0)
        assert f'href="http://127.0.0.1:9/episode?id={low}&amp;spec={spec_id}">worst' in rewards
        assert f'href="http://127.0.0.1:9/episode?id={high}&amp;spec={spec_id}">best' in rewards
    assert "worst" in section(page, "turns") and "best" in section(page, "policies")
    viewer = Viewer(demo, port=0)  # every linked page is one the viewer serves
    try:
        for path in re.findall(r'href="http://127\.0\.0\.1:9(/episode\?id=[^"]+)"', page):
            assert viewer.render(path.replace("&amp;", "&"))[0] == 200, path
    finally:
        viewer.server.server_close()


def test_the_report_and_the_viewer_read_a_runs_curves_one_way(tmp_path):
    """One read model: the report's curves, the viewer's train page and its sparklines read each step's metric
    by view.train_data.metric (a number, or None for text, a bool or a missing key), and the query the report
    shows reruns to the steps it plotted."""
    from trajlake.view.train_data import curve_table, read_steps, read_train, sparks

    metrics = [{"success_mean": 0.25, "kl": 0.5}, {"success_mean": "0.5", "kl": True}, {"kl": 1.0}]
    with Lake.open(str(tmp_path / "lake")) as lake:
        lake.append({"runs": [Run("r'1", "train", status="finished")],
                     "train_steps": [TrainStep("r'1", s, None, 1, m) for s, m in enumerate(metrics, 1)]},
                    stage="test", run_id="r'1")
        snap = lake.current_snapshot()
        steps = read_steps(lake, snap, ["r'1", "absent"])
        rows = curve_table(steps, {"success_mean": "success", "kl": "kl"})
        assert [(r["step"], r["success"], r["kl"]) for r in rows] == [(1, 0.25, 0.5), (2, None, None), (3, None, 1.0)]
        assert read_train(lake, snap, ["r'1"])["r'1"].steps == steps["r'1"]  # the viewer's train page reads these
        assert sparks(lake, snap)["r'1"] == ("success", [(1.0, 0.25), (2.0, None), (3.0, None)])
        assert lake.query(steps_query(["r'1"]), snapshot=snap)["step"].to_list() == [1, 2, 3]
        page = build_report(lake, tmp_path / "r").read_text()
        assert html.escape(steps_query(["r'1"])) in section(page, "learning")
