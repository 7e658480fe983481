"""Collect runs that stop and go on: resume after SIGKILL, env servers dying mid-run, errored episodes retried
on resume with their failed attempts kept, and a resumed run held to the settings it was started with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import assert_episodes_whole, cfg, episodes_of
from trajlake.collect.config import CollectConfig
from trajlake.collect.envs import make_env
from trajlake.collect.policies.scripted import ScriptedPolicy
from trajlake.collect.rollout import collect, episode_id
from trajlake.collect.summary import run_summary
from trajlake.collect.templates import get_template
from trajlake.core.errors import TrajlakeError
from trajlake.lm.load import load_tokenizer
from trajlake.store import Lake
from trajlake.store.reads import RunErrors, run_errors

# ---- resume after SIGKILL ---------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect
    from trajlake.store import Lake

    lake = Lake.open(sys.argv[1])
    append = lake.append

    def reporting_append(data, **kw):  # the real append; then tell the parent a chunk is stored
        result = append(data, **kw)
        if "episodes" in data:
            print("chunk", len(data["episodes"]), flush=True)
        return result

    lake.append = reporting_append
    collect(CollectConfig(**{config}), lake)
    print("finished", flush=True)
""")


@pytest.mark.slow  # 8 s: a collect process killed, then resumed
def test_resume_after_sigkill(tiny, tmp_path):
    uri = str(tmp_path / "lake")
    config = dict(env="maze", policy="scripted:maze", tokenizer=str(tiny), tasks=10, samples=2, max_turns=30,
                  concurrency=4, chunk_turns=4, chunk_seconds=3600.0, run_id="resumed", progress=False)
    script = tmp_path / "child.py"
    script.write_text(CHILD.replace("{config}", repr(config)))
    child = subprocess.Popen([sys.executable, str(script), uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    try:
        seen = []
        for line in child.stdout:
            seen.append(line)
            if sum(line.startswith("chunk") for line in seen) >= 2:
                os.kill(child.pid, signal.SIGKILL)  # somewhere after the second chunk: maybe mid-write
                break
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL, (seen, child.stderr.read())

    with Lake.open(uri) as lake:  # the DuckDB catalog recovers from its write-ahead log
        before = episodes_of(lake, "resumed")
        assert 2 <= before.height < 20, "killed mid-run"
        assert lake.query("SELECT status FROM runs WHERE run_id = 'resumed'")["status"][0] == "running"
        assert_episodes_whole(lake, "resumed")
        kept = {r["episode_id"]: r for r in before.iter_rows(named=True)}

        assert collect(CollectConfig(**config), lake) == "resumed"

        after = episodes_of(lake, "resumed")
        pairs = list(zip(after["task_id"], after["sample_index"], strict=True))
        assert len(pairs) == len(set(pairs)) == 20, "no duplicate and no missing (task, sample)"
        assert set(pairs) == {(t.task_id, k) for t in make_env("maze").tasks("train", n=10) for k in range(2)}
        assert_episodes_whole(lake, "resumed")
        for row in after.iter_rows(named=True):
            if row["episode_id"] in kept:
                assert row == kept[row["episode_id"]]  # what the killed run stored is untouched
        assert lake.query("SELECT status FROM runs WHERE run_id = 'resumed'")["status"][0] == "finished"
        assert lake.query("SELECT count(*) AS n FROM runs")["n"][0] == 1
        assert lake.query("SELECT count(*) AS n FROM tasks")["n"][0] == 10


# ---- env errors: an AgentGym server dies mid-run -----------------------------------------------------
class _ServerKiller(ScriptedPolicy):
    """The guess expert; stops the env server right after its first reply once an episode has ended, so some
    episodes are done, some are live (their env step fails) and some wait to start (their reset fails)."""

    def __init__(self, server, tokenizer):
        super().__init__("guess", get_template("think_action"), tokenizer)
        self.server, self.ended, self.stopped = server, 0, False

    def end_episode(self, key):
        super().end_episode(key)
        self.ended += 1

    def generate(self, requests, params):
        out = super().generate(requests, params)
        if self.ended and not self.stopped:
            self.server.stop()
            self.stopped = True
        return out


def test_agentgym_server_killed_mid_run(tiny, shared):
    from trajlake.collect.envs.agentgym_server import serve_env

    lake = shared
    server = serve_env("guess", split="train")
    try:
        config = cfg(env="agentgym/trajlake", env_url=server.url, policy="scripted:guess",
                     tokenizer=str(tiny), tasks=8, concurrency=3, max_turns=10)
        policy = _ServerKiller(server, load_tokenizer(tiny))
        run_id = collect(config, lake, policy=policy)
    finally:
        server.stop()

    eps = episodes_of(lake, run_id)
    assert eps.height == 8, "every (task, sample) is stored, whatever happened to it"
    assert set(eps["env"]) == {"guess"}
    status = Counter(eps["status"])
    assert status["ok"] >= 1 and status["error"] >= 1 and set(status) <= {"ok", "error"}
    assert all(eps.filter(eps["status"] == "ok")["success"])
    errors = eps.filter(eps["status"] == "error")
    assert not errors["success"].any()
    for row in errors.iter_rows(named=True):
        assert "cannot connect" in row["error"] and server.url in row["error"], row["error"]
    mid = errors.filter(errors["num_turns"] > 0)  # stepped when the server died: the played turns are kept
    assert mid.height >= 1 and all(e.startswith("EnvServerError: POST") for e in mid["error"])
    at_reset = errors.filter(errors["num_turns"] == 0)  # had not started yet
    assert at_reset.height >= 1 and all(e.startswith("reset failed: EnvServerError") for e in at_reset["error"])
    assert_episodes_whole(lake, run_id)
    assert lake.query("SELECT status FROM runs WHERE run_id = ?", [run_id])["status"][0] == "finished"
    assert run_errors(lake, run_id) == RunErrors(8, errors.height, min(errors["error"]))

    # the server is back (on another port: the url is not part of the run): the same run id replays exactly
    # the errored pairs, under new episode ids, and keeps the failed attempts as history
    server = serve_env("guess", split="train")
    try:
        resumed = collect(replace(config, run_id=run_id, env_url=server.url), lake)
    finally:
        server.stop()
    assert resumed == run_id
    after = episodes_of(lake, run_id)
    assert after.height == 8 + errors.height
    for row in eps.iter_rows(named=True):  # history: every row of the first run, untouched
        assert after.filter(after["episode_id"] == row["episode_id"]).row(0, named=True) == row
    new = after.filter(~after["episode_id"].is_in(eps["episode_id"].to_list()))
    assert sorted(zip(new["task_id"], new["sample_index"], strict=True)) == \
        sorted(zip(errors["task_id"], errors["sample_index"], strict=True))
    assert set(new["status"]) == {"ok"} and new["success"].all()
    assert set(new["episode_id"]) == {episode_id(run_id, t, k, 1) for t, k in _pairs(errors)}
    assert_episodes_whole(lake, run_id)
    assert run_errors(lake, run_id) == RunErrors(8, 0, None)
    assert lake.query("SELECT status FROM runs WHERE run_id = ?", [run_id])["status"][0] == "finished"
    summary = run_summary(lake, run_id).row(0, named=True)
    assert (summary["episodes"], summary["success_rate"], summary["errors"], summary["errors_retried"]) == \
        (8, 1.0, 0, errors.height)


def test_agentgym_remote_env_plays_like_the_builtin_one(tiny, shared):
    """The same tasks and expert through the HTTP protocol give the same episodes as in-process."""
    from trajlake.collect.envs.agentgym_server import serve_env

    lake = shared
    server = serve_env("doors", split="train")
    try:
        remote = collect(cfg(env="agentgym/trajlake", env_url=server.url, policy="scripted:doors",
                             tokenizer=str(tiny), tasks=4, run_id="remote"), lake)
    finally:
        server.stop()
    local = collect(cfg(env="doors", policy="scripted:doors", tokenizer=str(tiny), tasks=4, run_id="local"), lake)
    cols = ["task_id", "status", "success", "num_turns", "env_reward"]
    assert episodes_of(lake, remote).select(cols).equals(episodes_of(lake, local).select(cols))
    # (turn 0's prompt differs: the remote env has its own description in the system prompt)
    t_cols = ["turn", "observation", "action", "step_reward", "response_token_ids"]
    r = lake.query("SELECT e.task_id, t.* FROM turns t JOIN episodes e USING (episode_id) WHERE run_id = 'remote' "
                   "ORDER BY task_id, turn")
    loc = lake.query("SELECT e.task_id, t.* FROM turns t JOIN episodes e USING (episode_id) WHERE run_id = 'local' "
                     "ORDER BY task_id, turn")
    assert r.select(t_cols).equals(loc.select(t_cols))


def test_agentgym_unreachable_server_at_start_is_a_clear_error(tiny, untouched):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = cfg(env="agentgym/trajlake", env_url=f"http://127.0.0.1:{port}", env_kwargs={"retries": 0},
                 policy="scripted:guess", tokenizer=str(tiny), tasks=2)
    with pytest.raises(TrajlakeError, match="cannot connect"):
        collect(config, untouched)  # the task list itself comes from the server: nothing to play



# ---- resume: env errors are retried, a run keeps its settings ------------------------------------------------
class _CrashAtStart(ScriptedPolicy):
    """The guess expert of `test-flaky`; dies (as a killed process would) when its `n`-th episode starts."""

    def __init__(self, n, tokenizer):
        super().__init__("test-flaky", get_template("think_action"), tokenizer)
        self.n = n

    def start_episode(self, key, task):
        self.n -= 1
        if self.n == 0:
            raise RuntimeError("crashed")
        super().start_episode(key, task)


def _pairs(df) -> list[tuple[str, int]]:
    return sorted(zip(df["task_id"], df["sample_index"], strict=True))


def test_resume_retries_exactly_the_errored_pairs_and_keeps_their_history(tiny, lake, flaky_env):
    from trajlake.train.batch import load_episodes
    from trajlake.view.report import RUNS_SQL

    tasks = flaky_env().tasks("train", n=4)
    a, b = tasks[0].task_id, tasks[2].task_id
    flaky_env.failing = {a, b}  # their env server is down
    config = cfg(env="test-flaky", policy="scripted", tokenizer=str(tiny), tasks=4, samples=2, run_id="flaky",
                 concurrency=3, max_turns=10)
    assert collect(config, lake) == "flaky"
    first = episodes_of(lake, "flaky")
    errored = first.filter(first["status"] == "error")
    assert first.height == 8 and _pairs(errored) == [(a, 0), (a, 1), (b, 0), (b, 1)]
    for row in errored.iter_rows(named=True):
        why = f"cannot connect to the env server (task {row['task_id']})"
        assert row["error"] == f"reset failed: ConnectionError: {why}"
        assert row["num_turns"] == 0 and row["success"] is False
        assert row["episode_id"] == episode_id("flaky", row["task_id"], row["sample_index"])  # the first attempt
    assert set(first.filter(first["status"] != "error")["status"]) == {"ok"}
    assert lake.query("SELECT status FROM runs WHERE run_id = 'flaky'")["status"][0] == "finished"  # partly errored
    assert run_errors(lake, "flaky") == RunErrors(8, 4, errored["error"].min())
    s = run_summary(lake, "flaky").row(0, named=True)
    assert (s["episodes"], s["success_rate"], s["errors"], s["errors_retried"]) == (4, 1.0, 4, 0)

    # b's server is back, a's is not: every errored pair is retried once (attempt 1); a's fail again
    flaky_env.failing = {a}
    collect(config, lake)
    second = episodes_of(lake, "flaky")
    new = second.filter(~second["episode_id"].is_in(first["episode_id"].to_list()))
    assert _pairs(new) == [(a, 0), (a, 1), (b, 0), (b, 1)]
    assert set(new["episode_id"]) == {episode_id("flaky", t, k, 1) for t in (a, b) for k in (0, 1)}
    assert dict(zip(new["task_id"], new["status"], strict=False)) == {a: "error", b: "ok"}
    assert run_errors(lake, "flaky").errored == 2

    # a crash during the retries (the first of a's retries is stored, the second never starts), then a resume:
    # the stored retry is done, the other gets the same attempt number it would have had (2), once
    flaky_env.failing = set()
    with pytest.raises(RuntimeError, match="crashed"):
        collect(replace(config, concurrency=1), lake, policy=_CrashAtStart(2, load_tokenizer(tiny)))
    assert lake.query("SELECT status FROM runs WHERE run_id = 'flaky'")["status"][0] == "failed"
    crashed = episodes_of(lake, "flaky")
    assert crashed.height == 13
    assert_episodes_whole(lake, "flaky")
    collect(config, lake)
    final = episodes_of(lake, "flaky")
    assert final.height == 14
    assert set(final.filter((final["task_id"] == a) & (final["status"] == "ok"))["episode_id"]) == \
        {episode_id("flaky", a, k, 2) for k in (0, 1)}
    assert lake.query("SELECT status FROM runs WHERE run_id = 'flaky'")["status"][0] == "finished"
    assert_episodes_whole(lake, "flaky")

    # every pair has exactly one played episode; the failed attempts are all still there, untouched
    played = final.filter(final["status"] != "error")
    assert _pairs(played) == sorted((t.task_id, k) for t in tasks for k in (0, 1)) and played["success"].all()
    for row in first.iter_rows(named=True):
        assert final.filter(final["episode_id"] == row["episode_id"]).row(0, named=True) == row
    assert final.filter(final["status"] == "error").height == 6
    assert run_errors(lake, "flaky") == RunErrors(8, 0, None)

    # success rates and training batches count the played episodes only; the errors are counted apart
    s = run_summary(lake, "flaky").row(0, named=True)
    assert (s["episodes"], s["success_rate"], s["errors"], s["errors_retried"]) == (8, 1.0, 0, 6)
    cookbook = Path(__file__).resolve().parents[1] / "docs" / "queries"
    by_policy = lake.query((cookbook / "success_by_env_policy.sql").read_text())
    row = by_policy.filter(by_policy["env"] == "test-flaky").row(0, named=True)
    assert (row["episodes"], row["success_rate"], row["not_ok"], row["env_errors"]) == (8, 1.0, 0, 6)
    lineage = lake.query((cookbook / "policy_lineage.sql").read_text())
    row = lineage.filter(lineage["policy_id"] == "scripted:test-flaky").row(0, named=True)
    assert (row["episodes"], row["success_rate"]) == (8, 1.0)
    runs = lake.query(RUNS_SQL).row(0, named=True)
    assert (runs["episodes"], runs["success_rate"], runs["env_errors"]) == (8, 1.0, 6)
    seqs = load_episodes(lake, "run_id = 'flaky'", snapshot=lake.current_snapshot())
    assert sorted(x.episode_id for x in seqs) == sorted(played["episode_id"])
    assert Counter(x.group_id for x in seqs) == {f"flaky:{t.task_id}": 2 for t in tasks}  # GRPO groups of K
    assert load_episodes(lake, "NOT success", snapshot=lake.current_snapshot()) == []

    # nothing left to play: resuming again writes nothing
    before = lake.snapshots().height
    assert collect(config, lake) == "flaky"
    assert lake.snapshots().height == before


def test_a_run_whose_every_episode_errors_is_failed(tiny, lake, flaky_env):
    flaky_env.down = True
    config = cfg(env="test-flaky", policy="scripted", tokenizer=str(tiny), tasks=3, run_id="down")
    with pytest.raises(TrajlakeError, match=r"^collect run down failed: all 3 episodes ended with an env error "
                                            r"\(e\.g\. reset failed: ConnectionError: cannot connect .*--run-id down"):
        collect(config, lake)
    eps = episodes_of(lake, "down")
    assert eps.height == 3 and set(eps["status"]) == {"error"}
    assert lake.query("SELECT status FROM runs WHERE run_id = 'down'")["status"][0] == "failed"
    flaky_env.down = False
    collect(config, lake)  # mended: the retries play, the run finishes
    eps = episodes_of(lake, "down")
    assert eps.height == 6 and Counter(eps["status"]) == {"error": 3, "ok": 3}
    assert lake.query("SELECT status, finished_at IS NOT NULL AS f FROM runs WHERE run_id = 'down'").row(0) == \
        ("finished", True)


def test_resume_with_other_settings_is_refused_and_writes_nothing(tiny, lake):
    from trajlake.schemas import Run

    config = cfg(env="doors", policy="scripted:doors", tokenizer=str(tiny), tasks=2, difficulty=1, run_id="expert",
                 system_prompt="Open the door with the key.")
    collect(config, lake)
    lake.append({"runs": [Run("t1", "train", config={"env": "doors"}, status="finished")]}, stage="test")
    before = lake.snapshots().height
    refused = [
        (dict(policy=f"hf:{tiny}"), f"run expert already exists with policy 'scripted:doors'; given 'hf:{tiny}' "
                                    "(use a new --run-id)"),
        (dict(env="guess", policy="scripted:guess"), "run expert already exists with env 'doors', policy "
                                                     "'scripted:doors'; given env 'guess', policy 'scripted:guess' "
                                                     "(use a new --run-id)"),
        (dict(samples=2), "run expert already exists with samples 1; given 2 (use a new --run-id)"),
        (dict(tasks=3), "run expert already exists with tasks 2; given 3"),
        (dict(temperature=0.5, seed=1), "with temperature 1.0, seed 0; given temperature 0.5, seed 1"),
        (dict(system_prompt="Be brief."), "with system_prompt 'Open the door with the key.'; given 'Be brief.'"),
        # no system prompt given: the one built from the env differs from the stored one (checked once built)
        (dict(system_prompt=None), "with system_prompt 'Open the door with the key.'; given 'Open the door the key"),
        (dict(run_id="t1"), "run t1 already exists as a train run, not a collect run"),
    ]
    for changes, message in refused:
        with pytest.raises(TrajlakeError) as err:
            collect(replace(config, **changes), lake)
        assert message in str(err.value), (changes, str(err.value))
    assert lake.snapshots().height == before, "a refused resume wrote to the lake"
    # how the run is carried out may change: it resumes (nothing left to play, so nothing is written)
    assert collect(replace(config, concurrency=1, chunk_turns=1, chunk_seconds=1.0), lake) == "expert"
    assert lake.snapshots().height == before and episodes_of(lake, "expert").height == 2


def test_every_config_field_is_run_defining_or_operational():
    from dataclasses import fields

    from trajlake.collect.config import OPERATIONAL_FIELDS, RUN_FIELDS

    names = [f.name for f in fields(CollectConfig)]
    assert sorted(RUN_FIELDS + OPERATIONAL_FIELDS) == sorted(names), "a new CollectConfig field needs a side"
    remote = cfg(env="agentgym/trajlake", policy="scripted:guess", tokenizer="x",
                 env_url="http://127.0.0.1:1")
    stored = json.loads(json.dumps(remote.to_dict()))
    moved = {"retries": 5, "timeout": 60}
    assert replace(remote, env_url="http://10.0.0.2:8000", env_kwargs=moved, concurrency=4,
                   workers=2).differences(stored) == []
    # a run stored before env_url existed kept the URL in env_kwargs: still the same run
    old = {**stored, "env_kwargs": {"url": "http://127.0.0.1:1"}}
    del old["env_url"]
    assert remote.differences(old) == []
    assert replace(remote, env="agentgym/textcraft").differences(stored) == [
        ("env", "agentgym/trajlake", "agentgym/textcraft")]
    # an unset template plays the env's default: naming that default on a resume is the same run
    assert replace(remote, template="think_action").differences(stored) == []
    assert replace(remote, template="react").differences(stored) == [("template", "think_action", "react")]
    old = {k: v for k, v in stored.items() if k != "task_offset"}  # a lake from before the field existed
    assert replace(remote, task_offset=3).differences(old) == []


def test_a_run_whose_task_list_changed_is_refused(tiny, lake, monkeypatch):
    """The same settings listing other tasks (an old AgentGym run under the stratified splits) would mix two task
    lists in one run: refused, nothing written."""
    config = cfg(env="doors", policy="scripted:doors", tokenizer=str(tiny), tasks=2, difficulty=1, run_id="moved")
    collect(config, lake)
    doors = type(make_env("doors"))
    listed = doors.tasks
    monkeypatch.setattr(doors, "tasks", lambda self, split, n=None, difficulty=None:
                        listed(self, split, n=(n or 0) + 2, difficulty=difficulty)[2:])
    before = lake.snapshots().height
    with pytest.raises(TrajlakeError, match=r"collect run moved holds episodes of 2 task\(s\) its settings no longer "
                                            r"list .*split_scheme=\"contiguous\""):
        collect(config, lake)
    assert lake.snapshots().height == before
