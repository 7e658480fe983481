"""trajlake against AgentGym's real TextCraft server (../shared/agentgym), not an imitation of it.

The server runs as its own process on 127.0.0.1 (fixture `textcraft_url`, or `textcraft_server()` where a test
needs a server of its own). These tests check what a user of `agentgym/textcraft` gets: observations, step
rewards, success, instances closed, timeouts, and episodes collected by a real model and by the scripted expert.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import requests

from tests.conftest import require_textcraft_server
from tests.helpers import cfg, episodes_of, turns_of
from trajlake.collect.envs import make_env
from trajlake.collect.envs.agentgym_client import EnvServerError, detect_preset, resolve_env_name
from trajlake.collect.envs.agentgym_launch import textcraft_server
from trajlake.collect.policies.scripted import ScriptedPolicy
from trajlake.collect.rollout import collect
from trajlake.collect.templates import get_template
from trajlake.core.errors import TrajlakeError
from trajlake.lm.load import load_tokenizer
from trajlake.store import Lake

FAST = {"timeout": 10.0, "connect_timeout": 2.0, "retries": 1, "backoff": 0.05}


def closed(url: str, env_id: int) -> bool:
    """Whether the server has closed instance `env_id` (its /detail then says the id is not valid)."""
    reply = requests.get(f"{url}/detail", params={"id": env_id}, timeout=5).json()
    return isinstance(reply, dict) and "is not valid" in str(reply.get("error", ""))


def play_expert(env, task, max_steps: int = 40) -> list[tuple]:
    expert = env.expert()
    expert.reset(task)
    obs, steps = env.reset(task), []
    for _ in range(max_steps):
        obs, reward, done, info = env.step(expert.act(obs))
        steps.append((obs, reward, done, info))
        if done:
            break
    return steps


def test_the_real_server_plays_through_the_client(textcraft_url):
    env = make_env("agentgym/textcraft", url=textcraft_url, **FAST)
    tasks = env.tasks("test", n=3)  # a seeded sample of the test split (stratified-v1): ids name data indices
    assert [t.task_id for t in tasks] == [f"agentgym/textcraft/test/{t.meta['data_idx']}" for t in tasks]
    first = env.reset(tasks[1])
    assert first.startswith("Crafting commands:\ncraft ") and "\n\nGoal: craft " in first
    assert env.reset(tasks[1]) == first  # a task is a data index: the same one gives the same game

    # an action the game refuses: observation from the server, reward 0, not done, valid false
    obs, reward, done, info = env.step("get 1 diamond pickaxe")
    assert obs.startswith("Could not find") and (reward, done, info["valid"]) == (0.0, False, False)
    # what AgentGym's own client strips (punctuation) is stripped before sending, and recorded
    obs, reward, done, info = env.step("inventory.")
    assert obs.startswith("Inventory:") and info == {"valid": True, "sent_action": "inventory"}

    steps = play_expert(env, tasks[1])
    assert steps[-1][1:3] == (1.0, True) and steps[-1][3]["success"] is True and steps[-1][3]["valid"] is True
    assert all(r == 0.0 and not d and "success" not in i for _, r, d, i in steps[:-1])  # reward only at the win
    assert steps[-1][0].startswith("Crafted ")
    env_id = env.env_id
    env.close()
    assert closed(textcraft_url, env_id) and env.env_id is None


def test_each_episode_closes_its_instance(textcraft_url):
    env = make_env("agentgym/textcraft", url=textcraft_url, **FAST)
    ids = []
    for task in env.tasks("val", n=3):
        env.reset(task)
        ids.append(env.env_id)
    assert [closed(textcraft_url, i) for i in ids] == [True, True, False]  # each reset closed the last one
    env.close()
    assert closed(textcraft_url, ids[-1])


def test_wrong_preset_against_the_real_server_is_a_clear_error(textcraft_url):
    # babyai's /create sends no body; the real TextCraft server refuses that (HTTP 422): one clear error
    env = make_env("agentgym/babyai", url=textcraft_url, **FAST)
    with pytest.raises(EnvServerError, match=r"POST .*/create: HTTP 422"):
        env.reset(env.tasks("test", n=1)[0])
    assert detect_preset(textcraft_url) == "textcraft"
    assert resolve_env_name("agentgym", textcraft_url) == "agentgym/textcraft"
    assert resolve_env_name("agentgym", textcraft_url, "textcraft") == "agentgym/textcraft"
    with pytest.raises(TrajlakeError, match="unknown AgentGym environment 'nope'"):
        resolve_env_name("agentgym", textcraft_url, "nope")
    with pytest.raises(TrajlakeError, match="--env agentgym needs --env-url"):
        resolve_env_name("agentgym", None)


def test_a_paused_server_times_out_steps_are_not_retried_and_it_recovers():
    require_textcraft_server()
    with textcraft_server() as server:
        env = make_env("agentgym/textcraft", url=server.url, timeout=0.5, connect_timeout=1.0, retries=2,
                       backoff=0.05)
        task = env.tasks("test", n=1)[0]
        env.reset(task)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(EnvServerError, match=r"/step: no reply within 0\.5s; not retried"):
                env.step("inventory")
            with pytest.raises(EnvServerError, match=r"/create: no reply within 0\.5s; not retried"):
                env.reset(task)  # creating twice could leave an instance behind: not retried either
            assert time.monotonic() - start < 5
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        env.timeout = 10.0
        assert env.reset(task).startswith("Crafting commands:")  # the server is back: a new episode plays


@pytest.fixture(scope="module")
def own_server():
    """A TextCraft server of this module's own, so that every instance it ever made can be checked closed."""
    require_textcraft_server()
    with textcraft_server() as server:
        yield server.url


def test_collect_with_a_real_model_on_the_real_server(own_server, tiny, tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        run_id = collect(cfg(env="agentgym/textcraft", env_url=own_server, policy=f"hf:{tiny}", tasks=3,
                             samples=2, max_turns=3, max_new_tokens=12, concurrency=4, run_id="tiny-tc"), lake)
        eps = episodes_of(lake, run_id)
        assert eps.height == 6 and set(eps["status"]) <= {"ok", "truncated"}, eps["error"].to_list()
        assert set(eps["env"]) == {"agentgym/textcraft"}
        assert set(eps["task_id"]) == {t.task_id for t in make_env("agentgym/textcraft").tasks("train", n=3)}
        turns = turns_of(lake, run_id)
        assert turns.height == eps["num_turns"].sum() and turns.height >= 6
        firsts = turns.filter(turns["turn"] == 0)
        assert all(o.startswith("Crafting commands:") for o in firsts["observation"])
        # the model was told the task and the action format: the system prompt has both
        system = json.loads(lake.query("SELECT config FROM runs WHERE run_id = ?", [run_id])["config"][0])
        assert "get N ITEM" in system["system_prompt"] and "Action:" in system["system_prompt"]
        assert system["template"] is None  # the env's default (react) was played
        assert all(len(ids) > 0 for ids in turns["response_token_ids"])
    # every instance the run created was closed (ids are numbered from 0 on a fresh server)
    assert all(closed(own_server, i) for i in range(6))


def test_scripted_expert_collects_wins_through_the_cli(own_server, tiny, tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "cli-lake")
    # --env agentgym alone: the server says which environment it is
    assert main(["--lake", uri, "collect", "--env", "agentgym", "--env-url", own_server, "--policy", "scripted",
                 "--tokenizer", str(tiny), "--tasks", "6", "--max-turns", "30", "--split", "val",
                 "--run-id", "expert-tc"]) == 0
    assert "agentgym/textcraft" in capsys.readouterr().out
    with Lake.open(uri) as lake:
        eps = episodes_of(lake, "expert-tc")
        assert eps.height == 6 and eps["success"].all() and set(eps["status"]) == {"ok"}
        assert (eps["env_reward"] == 1.0).all()
        turns = turns_of(lake, "expert-tc")
        assert turns["format_ok"].all()  # the expert replies in the react template the env is played with
        react = get_template("react")
        assert all(react.parse(t) == a for t, a in zip(turns["action_text"], turns["action"], strict=True))
        assert lake.query("SELECT policy_id FROM episodes WHERE run_id = 'expert-tc' LIMIT 1")["policy_id"][0] == \
            "scripted:agentgym/textcraft"


@pytest.mark.parametrize("argv, message", [
    (["--env", "agentgym/textcraft", "--policy", "scripted:maze"],
     "scripted:maze is the expert of env 'maze', but the env played is 'agentgym/textcraft'"),
    (["--env", "agentgym/babyai", "--policy", "scripted"], "agentgym/babyai has no scripted expert"),
    (["--env", "agentgym/textcraft", "--policy", "scripted:textcraft", "--template", "nope"], "unknown template"),
])
def test_policy_and_env_mismatches_are_one_line_errors(argv, message, textcraft_url, tiny, tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "lake")
    assert main(["--lake", uri, "collect", *argv, "--env-url", textcraft_url, "--tokenizer", str(tiny),
                 "--tasks", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_without_a_url_agentgym_envs_say_so(tiny, tmp_path, capsys):
    from trajlake.cli import main

    assert main(["--lake", str(tmp_path / "lake"), "collect", "--env", "agentgym/textcraft", "--policy", "scripted",
                 "--tokenizer", str(tiny)]) == 1
    assert "agentgym/textcraft plays an AgentGym server: give its URL (--env-url URL)" in capsys.readouterr().err


ENV = "agentgym/textcraft"


class _KillsTheServer(ScriptedPolicy):
    """The TextCraft expert, killing the real server's process once an episode has ended, so that some episodes
    are done, some are live (their step fails) and some wait to start (their reset fails)."""

    def __init__(self, process, tokenizer):
        super().__init__(ENV, get_template("react"), tokenizer)
        self.process, self.ended = process, 0

    def end_episode(self, key):
        super().end_episode(key)
        self.ended += 1

    def generate(self, requests, params):
        out = super().generate(requests, params)
        if self.ended and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        return out


def test_a_killed_real_server_loses_nothing_and_a_resume_retries_what_failed(tiny, tmp_path):
    require_textcraft_server()
    base = dict(env=ENV, policy=f"scripted:{ENV}", tokenizer=str(tiny), tasks=6, concurrency=3, max_turns=30,
                run_id="killed", env_kwargs={"retries": 0, "connect_timeout": 1.0})
    with Lake.open(str(tmp_path / "lake")) as lake:
        with textcraft_server() as server:
            config = cfg(**{**base, "env_url": server.url})
            collect(config, lake, policy=_KillsTheServer(server.process, load_tokenizer(tiny)))
        eps = episodes_of(lake, "killed")
        errors = eps.filter(eps["status"] == "error")
        assert eps.height == 6 and errors.height >= 1 and (eps["status"] == "ok").sum() >= 1
        assert all("cannot connect" in e for e in errors["error"])
        # the server is back (on another port): the same run id plays exactly the failed pairs again
        with textcraft_server() as server:
            config = cfg(**{**base, "env_url": server.url})
            assert collect(config, lake) == "killed"
        after = episodes_of(lake, "killed")
        assert after.height == 6 + errors.height  # the failed attempts stay as history
        played = after.filter(after["status"] != "error")
        assert played.height == 6 and played["success"].all()
        assert sorted(played["task_id"]) == sorted(eps["task_id"])
