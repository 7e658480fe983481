"""The viewer's static export from bulk reads (view/export.py) against the per-page path: over a small
lake with several runs (one an eval run, one a train run with its steps, policies and that eval), groups and an
episode without one, two specs (one spreading the reward over every agent token), a tokenizer (replies shown
token by token) and hostile ids, every exported file (the train run's pages too) is byte for byte the page
`Pages` renders for it, and no other file is written. Long runs come in parts, served
and exported, with links between them; the export says how far it is on stderr, one line per step; and
bench/viewer.py runs at a tiny size and writes its headline rows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import load_bench
from tests.viewer_helpers import EP, EP_ISSUE, EP_PERCENT, SPEC, TEXT, Tags, payload
from trajlake.schemas.records import Episode, EpisodeReward, Policy, RewardSpecRow, Run, Task, TrainStep, Turn
from trajlake.store import Lake
from trajlake.view import export, pages, render
from trajlake.view.pages import Links, Pages
from trajlake.view.server import Viewer, export_site
from trajlake.view.train_data import train_ids

RUNS = ["collect-a", "../" + payload("run"), "eval-b"]
#: a train run: collect-a is its iteration's run, eval-b the eval of its checkpoint `pol`
TRAIN = "train/" + payload("train")
IDS = [EP, EP_ISSUE, EP_PERCENT, "..", ".", "x" * 300, "\x01\n\t", "é/ü"] + [f"ep-{i:02d}" for i in range(10)]


def _lake(path: Path, tokenizer: Path) -> None:
    """Episodes spread over RUNS in groups of 3 (the last two without one), 1-3 turns each, scored under a
    last-token spec and the hostile-named discounted one (every agent token rewarded)."""
    now = datetime.now(timezone.utc)
    eps, turns, rewards = [], [], []
    for i, eid in enumerate(IDS):
        run = RUNS[i % len(RUNS)]
        group = None if i >= len(IDS) - 2 else f"group-{i // 3}"
        eps.append(Episode(eid, run_id=run, policy_id="pol", task_id=f"task-{i // 3}", env="doors", group_id=group,
                           sample_index=i % 3, status="ok", success=i % 2 == 0, env_reward=i / 7, num_turns=1 + i % 3,
                           num_agent_tokens=4 * (1 + i % 3), error=TEXT["error"] if i == 2 else None))
        for t in range(1 + i % 3):
            turns.append(Turn(eid, t, observation=TEXT["observation"] if i < 3 else f"obs {t}", action_text=f"go {t}",
                              action="go", format_ok=True, step_reward=0.1 * t, done=t == i % 3,
                              info={"note": payload("info")} if i == 0 else None,
                              prompt_token_ids=tuple(range(3 + t)), response_token_ids=(40 + t, 41, 300 + i, 7)))
        rewards += [EpisodeReward("last", eid, total=(i % 5) / 4), EpisodeReward(SPEC, eid, total=1.0 - i / 9)]
    with Lake.open(str(path)) as lk:
        lk.append({"tasks": [Task(f"task-{k}", "doors", split="test", instruction=f"do {k}") for k in range(7)],
                   "runs": [Run(r, "eval" if r.startswith("eval") else "collect", config={"tokenizer": str(tokenizer)},
                                status="finished", started_at=now, parent_run_id=TRAIN if r == "collect-a" else None)
                            for r in RUNS] + [Run(TRAIN, "train", config={"model": "m", "lr": 0.5, "iterations": 2},
                                                  status="finished", started_at=now - timedelta(minutes=1))],
                   "policies": [Policy("base"), Policy("pol", run_id=TRAIN, step=2, parent_policy_id="base")],
                   "train_steps": [TrainStep(TRAIN, 1, None, 1, {"reward_mean": 0.1, "loss": 2.0}, "last",
                                             (*IDS[:5], "gone")),
                                   TrainStep(TRAIN, 2, "pol", 1, {"reward_mean": 0.4, "loss": None, payload("m"): 3},
                                             "last", tuple(IDS[3:]))],
                   "reward_specs": [RewardSpecRow("last", "last", {"allocation": {"strategy": "last_token"}},
                                                  now - timedelta(hours=1)),
                                    RewardSpecRow(SPEC, "spread", {"allocation": {"strategy": "discounted",
                                                                                  "gamma": 0.9}}, now)],
                   "episodes": eps, "turns": turns, "episode_rewards": rewards}, stage="collect", run_id="fixture")


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from trajlake.lm.build import _train_tokenizer

    root = tmp_path_factory.mktemp("viewer-export")
    _train_tokenizer(512).save_pretrained(root / "tokenizer")
    _lake(root / "lake", root / "tokenizer")
    with Lake.open(str(root / "lake"), read_only=True) as lk:
        yield lk


@pytest.fixture
def small_parts(monkeypatch):
    """Runs of more than 2 episodes in parts (every module that reads the constant sees it)."""
    for module in (render, pages, export):
        monkeypatch.setattr(module, "RUN_PAGE_ROWS", 2)


def per_page_site(lake, spec: str | None) -> dict[Path, str]:
    """Every page the export writes, as the per-page path renders it: relative path -> text."""
    snap = lake.current_snapshot()
    pages = Pages(lake, snap, spec, Links(static=True))
    out = {Path("index.html"): pages.runs()}
    for run_id, n in lake.query("SELECT run_id, count(*) FROM episodes GROUP BY 1").rows():
        for part in range(1, -(-n // render.RUN_PAGE_ROWS) + 1):
            out[Path("runs", Links.page_file(run_id, part))] = pages.run(run_id, part)
    for (eid,) in lake.query("SELECT episode_id FROM episodes").rows():
        out[Path("episodes", Links.page_file(eid))] = pages.episode(eid)
    for run in train_ids(lake, snap):
        out[Path("train", Links.page_file(run))] = pages.train(run)
        out[Path("evals", Links.page_file(run))] = pages.evals(run)
    for run, step in lake.query("SELECT run_id, step FROM train_steps WHERE episode_ids IS NOT NULL").rows():
        out[Path("trained", Links.trained_file(run, step))] = pages.trained(run, step)
    return out


def files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow  # 7 s per spec: every page both ways
@pytest.mark.parametrize("spec", [None, "last"])  # None: the last scored, the hostile-named discounted one
def test_the_export_writes_the_per_page_pages(lake, tmp_path, spec):
    assert export_site(lake, tmp_path / "site", spec=spec, progress=False) == len(IDS)
    want = per_page_site(lake, spec or SPEC)  # none asked for: the last scored
    got = files(tmp_path / "site")
    assert got.keys() == want.keys()
    for path, text in want.items():
        assert got[path] == text.encode("utf-8"), path  # bytes: a token may decode to a lone "\r"
    some = got[Path("episodes", Links.page_file(IDS[4]))].decode()
    assert 'class="tok"' in some and "advantage" in some and 'id="held-out"' in got[
        Path("runs", Links.page_file("eval-b"))].decode()
    train = got[Path("train", Links.page_file(TRAIN))].decode()  # its curves, its eval, its steps
    assert '<svg class="chart"' in train and 'data-run="eval-b" data-role="own"' in train
    trained = got[Path("trained", Links.trained_file(TRAIN, 1))].decode()
    assert trained.count("<tr data-id=") == 5 and "1 no longer in the lake" in trained


def test_long_runs_come_in_parts_served_and_exported(lake, tmp_path, small_parts):
    export_site(lake, tmp_path / "site", spec="last", progress=False)
    runs = tmp_path / "site" / "runs"
    n = lake.query("SELECT count(*) FROM episodes WHERE run_id = 'collect-a'").item()
    parts = {p.name for p in runs.glob("collect-a*")}
    assert parts == {"collect-a.html"} | {f"collect-a%p{k}.html" for k in range(2, -(-n // 2) + 1)}
    first = (runs / "collect-a.html").read_text()
    assert f"showing episodes 1 to 2 of {n} " in first and first.count("<tr data-id=") == 2
    hrefs = [dict(a)["href"] for tag, a in Tags(first).elements if tag == "a" and dict(a).get("href", "").startswith(
        "../runs/")]
    assert hrefs and all((runs / unquote(h.removeprefix("../runs/"))).is_file() for h in hrefs)  # the next part
    hostile = sorted(runs.glob(Links.page_file(RUNS[1])[:20] + "*"))
    assert len(hostile) >= 2 and all(p.parent == runs for p in hostile)
    viewer = Viewer(lake, port=0)
    try:
        status, page = viewer.render("/run?id=collect-a&page=2")
        assert status == 200 and f"showing episodes 3 to 4 of {n} " in page and "page=3" in page
        assert viewer.render("/run?id=collect-a&page=2")[1] == viewer.render("/run/collect-a?page=2")[1]
        for bad in ("0", "-1", "x", "99", "1" * 12):
            status, page = viewer.render(f"/run?id=collect-a&page={bad}")
            assert status == 404 and "no page" in page, bad
    finally:
        viewer.server.server_close()


def test_the_export_says_how_far_it_is(lake, tmp_path, capfd, monkeypatch):
    """Off a terminal (here): one line per step on stderr, nothing on stdout; progress=False: silent."""
    monkeypatch.setattr(export, "CHUNK", 5)
    export_site(lake, tmp_path / "site", progress=True)
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    chunks = -(-len(IDS) // 5)
    assert out == "" and len(lines) == 1 + chunks
    assert all(line.startswith("view --out episode pages ") for line in lines)
    assert "the index and" in lines[0] and f"episode pages 0/{len(IDS)} " in lines[0]
    assert f"episode pages {len(IDS)}/{len(IDS)} " in lines[-1]
    export_site(lake, tmp_path / "again", progress=False)
    assert capfd.readouterr() == ("", "")


@pytest.mark.slow  # 10 s: two lakes built and scored, the per-page path's queries
def test_bench_writes_its_headline_rows(tmp_path, capsys):
    bench = load_bench("viewer")
    path = tmp_path / "rows.json"
    assert bench.main(["--episodes", "24", "--turns-per-episode", "2", "--runs", "2", "--baseline-pages", "3",
                       "--served-episodes", "16", "--no-tokenizer", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [r["stage"] for r in rows] == ["viewer export: 24 episodes", "viewer served page: 16 episodes"]
    for r in rows:
        assert r["unit"] == "s" and r["trajlake_value"] > 0 and r["alternative_value"] > 0
        assert isinstance(r["met"], bool) and r["ratio"] == pytest.approx(r["alternative_value"] / r["trajlake_value"],
                                                                          rel=1e-2)
    assert "EXTRAPOLATED" in capsys.readouterr().out and "identical" in rows[0]["note"]


def test_view_out_writes_every_episode_or_the_first_n(tmp_path):
    """`trajlake view --out` exports every episode's page unless --max-episodes caps it; the cap goes with --out."""
    from typer.testing import CliRunner

    from trajlake.cli import app

    lake_dir = tmp_path / "lake"
    with Lake.open(str(lake_dir)) as lake:
        lake.append({"episodes": [Episode(f"e{i}", run_id="r") for i in range(7)]}, stage="collect")
    runner = CliRunner()
    done = runner.invoke(app, ["--lake", str(lake_dir), "view", "--out", str(tmp_path / "all")])
    assert done.exit_code == 0, done.output
    assert len(list((tmp_path / "all" / "episodes").iterdir())) == 7
    done = runner.invoke(app, ["--lake", str(lake_dir), "view", "--out", str(tmp_path / "some"), "--max-episodes", "3"])
    assert done.exit_code == 0 and len(list((tmp_path / "some" / "episodes").iterdir())) == 3
    done = runner.invoke(app, ["--lake", str(lake_dir), "view", "--max-episodes", "3", "--port", "0"])
    assert done.exit_code != 0 and "--max-episodes go with --out" in done.output
