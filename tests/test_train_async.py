"""Asynchronous RL (`async_collectors`, train/sources/asynchronous.py): collector processes (Ray actors) play the
newest stored policy into a lake other processes can write while the learner trains on the groups they stored.
Tested for real on the tiny model and a SQLite-catalog lake: what each step trained on is in the store, never
twice, and within the staleness bound; the collectors pick up each new policy; a collector killed mid-run is
restarted and loses only its chunk in flight; a learner killed (SIGKILL) and started again goes on from the store;
and the rules refuse, in one line each, a DuckDB-file lake and the settings async cannot honour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import small_cfg, tiny_model_dir, varied_spec
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.train.config import ConfigError
from trajlake.train.loop import train
from trajlake.train.sources.asynchronous import AsyncRollouts

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("fresh_ray")
ASYNC = dict(async_collectors=2, old_logprobs="behaviour", tasks=2, samples=2, minibatch_size=4, micro_batch=2,
             run_id="async")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def config(model, tmp_path: Path, **kw):
    return small_cfg(model, reward_spec=varied_spec(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                     **{**ASYNC, **kw})


def steps(lake: Lake, run_id: str = "async") -> list[dict]:
    """Each train step of the run: its number, the episodes it trained on, their policies' steps."""
    rows = lake.query("SELECT step, episode_ids FROM train_steps WHERE run_id = ? AND step > 0 ORDER BY step",
                      [run_id]).to_dicts()
    for row in rows:
        played = lake.query("SELECT coalesce(p.step, 0) AS v, e.run_id FROM episodes e LEFT JOIN policies p "
                            "ON p.policy_id = e.policy_id AND p.run_id = ? WHERE list_contains(?, e.episode_id)",
                            [run_id, row["episode_ids"]])
        row["versions"] = sorted(set(played["v"].to_list()))
        row["runs"] = sorted(set(played["run_id"].to_list()))
    return rows


def check_trained_once_within_staleness(rows: list[dict], staleness: int, episodes: int) -> None:
    trained = [e for row in rows for e in row["episode_ids"]]
    assert len(trained) == len(set(trained)), "an episode trained on twice"
    for row in rows:
        assert len(row["episode_ids"]) == episodes
        assert all(row["step"] - 1 - v <= staleness for v in row["versions"]), row
        assert all(r.startswith("async/async-") for r in row["runs"]), "only the collectors' episodes"


@pytest.mark.slow  # Ray, two collector actors and the learner on 2 cores: about a minute
def test_collectors_and_learner_meet_only_through_the_lake(model, tmp_path):
    with Lake.open(f"sqlite:{tmp_path / 'lake.sqlite'}") as lake:
        res = train(config(model, tmp_path, iterations=4, async_staleness=1), lake)
        assert res.step == 4
        rows = steps(lake)
        check_trained_once_within_staleness(rows, 1, episodes=4)
        played = lake.query("SELECT DISTINCT e.policy_id FROM episodes e WHERE starts_with(e.run_id, "
                            "'async/async-')")["policy_id"].to_list()
        assert any(p.startswith("async/step-") for p in played), "the collectors never picked up a new policy"
        metrics = lake.query("SELECT metrics FROM train_steps WHERE run_id = 'async' AND step = 4").item()
        assert {"learner_wait_s", "stale_groups", "staleness_mean"} <= set(__import__("json").loads(metrics))
        # the chunks the collectors were playing when the learner stopped them are ended, not left running
        status = lake.query("SELECT status, count(*) AS n FROM runs WHERE starts_with(run_id, 'async/async-') "
                            "GROUP BY status")
        assert "running" not in status["status"].to_list(), status


@pytest.mark.slow
def test_a_collector_killed_mid_run_is_restarted_and_loses_only_its_chunk_in_flight(model, tmp_path, monkeypatch):
    episodes = AsyncRollouts.episodes

    def kill_a_collector_before_the_second_step(source, it):
        if it == 1:
            ray.kill(source.actors[0], no_restart=False)  # a real kill; Ray restarts the actor and its loop
        return episodes(source, it)

    monkeypatch.setattr(AsyncRollouts, "episodes", kill_a_collector_before_the_second_step)
    with Lake.open(f"sqlite:{tmp_path / 'lake.sqlite'}") as lake:
        assert train(config(model, tmp_path, iterations=4), lake).step == 4
        check_trained_once_within_staleness(steps(lake), 1, episodes=4)
        chunks = lake.query("SELECT run_id FROM runs WHERE starts_with(run_id, 'async/async-0-') ORDER BY run_id")
        numbers = sorted(int(r.rsplit("-", 1)[1]) for r in chunks["run_id"])
        assert numbers == list(range(1, len(numbers) + 1)), "a restarted collector numbers on, replaying none"
        twice = lake.query("SELECT count(*) - count(DISTINCT (run_id, task_id, sample_index)) FROM episodes").item()
        assert twice == 0


LEARNER = """
import sys
from tests.helpers import small_cfg, varied_spec
from trajlake.store import Lake
from trajlake.train.loop import train
from pathlib import Path
model, folder, iterations = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
cfg = small_cfg(model, reward_spec=varied_spec(folder), checkpoint_dir=str(folder / "ckpt"), iterations=iterations,
                **{ASYNC})
with Lake.open(f"sqlite:{folder / 'lake.sqlite'}") as lake:
    print("steps", train(cfg, lake).step)
"""


@pytest.mark.slow
def test_a_learner_killed_and_started_again_goes_on_from_the_store(model, tmp_path):
    script = tmp_path / "learner.py"
    script.write_text(LEARNER.replace("{ASYNC}", repr(ASYNC)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    learner = subprocess.Popen([sys.executable, str(script), str(model), str(tmp_path), "5"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and learner.poll() is None:
            time.sleep(1)
            try:
                with Lake.open(f"sqlite:{tmp_path / 'lake.sqlite'}", read_only=True) as lake:
                    if lake.query("SELECT count(*) FROM train_steps WHERE run_id = 'async' AND step > 0").item() >= 2:
                        break
            except TrajlakeError:  # the learner has not made its lake, or its tables, yet
                continue
    finally:
        if learner.poll() is None:
            os.killpg(learner.pid, signal.SIGKILL)  # the learner and everything it started
        out = learner.communicate()[0]
    assert learner.returncode == -signal.SIGKILL, out[-3000:]
    again = subprocess.run([sys.executable, str(script), str(model), str(tmp_path), "5"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "steps 5" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    with Lake.open(f"sqlite:{tmp_path / 'lake.sqlite'}") as lake:
        rows = steps(lake)
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
        check_trained_once_within_staleness(rows, 1, episodes=4)


def test_a_duckdb_file_lake_is_refused_in_one_line_before_anything_is_written(model, tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        with pytest.raises(ConfigError, match="async_collectors write the lake from their own processes .* a DuckDB "
                                              "file, which admits one process: use a sqlite:FILE or postgres"):
            train(config(model, tmp_path, iterations=1), lake)
        assert lake.query("SELECT count(*) FROM runs").item() == 0


@pytest.mark.parametrize("changes, message", [
    (dict(old_logprobs="recompute"), 'trains on rollouts of earlier policies: .* old_logprobs = "behaviour"'),
    (dict(replicas=2), "not with replicas"),
    (dict(task_selector="frontier"), "not with task_selector frontier"),
    (dict(sampling_rounds=2, min_outcome_groups=1), "not with dynamic sampling"),
    (dict(async_staleness=-1), "async_staleness must be >= 0"),
])
def test_settings_async_cannot_honour_are_refused_in_one_line(model, tmp_path, changes, message):
    with pytest.raises(TrajlakeError, match=message):
        config(model, tmp_path, iterations=1, **changes)
