"""The AgentGym HTTP path end to end on loopback: trajlake's env server and the AgentGymClient that plays it."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
import threading
import time

import pytest
import requests

from trajlake.collect.envs import make_env
from trajlake.collect.envs.agentgym_client import AgentGymClient, EnvServerError, task_selector
from trajlake.collect.envs.agentgym_presets import PRESETS
from trajlake.collect.envs.agentgym_protocol import Preset, win_reward_at_least_one
from trajlake.collect.envs.agentgym_server import serve_env
from trajlake.collect.envs.maze import MazeEnv
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task

BUILTINS = ["crafting", "doors", "guess", "maze"]
ACTIONS = ["move north", "move east", "move south", "open red", "read sign", "guess 3", "guess 12", "inventory",
           "get wood", "craft stick", "xyzzy", "", None]
FAST = {"timeout": 2.0, "connect_timeout": 1.0, "retries": 2, "backoff": 0.05}


@pytest.fixture
def server(request):
    """A server for the env (and keyword options) named by `request.param`, stopped afterwards."""
    name, kwargs = request.param if isinstance(request.param, tuple) else (request.param, {})
    srv = serve_env(name, **kwargs)
    yield srv
    srv.stop()


def expert_transcript(env, task: Task) -> list:
    """Play `task` on `env` (local or remote) with the scripted expert of the task's env."""
    expert = make_env(task.env).expert()
    obs = env.reset(task)
    expert.reset(task)
    transcript, done = [obs], False
    while not done:
        action = expert.act(obs)
        obs, reward, done, info = env.step(action)
        transcript.append((action, obs, reward, done, info))
    return transcript


def random_transcript(env, task: Task, seed: int, n: int = 10) -> list:
    rng = random.Random(seed)
    transcript = [env.reset(task)]
    for _ in range(n):
        transcript.append(env.step(rng.choice(ACTIONS)))
        if transcript[-1][2]:
            break
    return transcript


def strip_data_idx(task: Task) -> Task:
    return dataclasses.replace(task, meta={k: v for k, v in task.meta.items() if k != "data_idx"})


# ---- same transcripts over HTTP as in process ---------------------------------------------------------------


@pytest.mark.parametrize("server", BUILTINS, indirect=True)
def test_expert_over_http_matches_in_process(server):
    name = server.app.name
    tasks = make_env(name).tasks("test", n=8)
    client = AgentGymClient(server.url, "trajlake", **FAST)
    for i, task in enumerate(tasks):
        remote, local = expert_transcript(client, task), expert_transcript(make_env(name), task)
        assert remote == local and remote[-1][4]["success"] is True
        assert server.app.live == 1  # the last episode's instance was closed by this reset
        assert random_transcript(client, task, i) == random_transcript(make_env(name), task, i)
    client.close()
    assert server.app.live == 0


@pytest.mark.parametrize("server", [("maze", {"preset": "textcraft"})], indirect=True)
def test_agentgym_tasks_are_data_indices_of_the_split(server):
    client = AgentGymClient(server.url, "textcraft", **FAST)
    remote = client.tasks("test", n=6)  # stratified-v1: a seeded sample of the test split's data indices
    idx = [t.meta["data_idx"] for t in remote]
    assert [t.task_id for t in remote] == [f"agentgym/textcraft/test/{i}" for i in idx]
    assert {t.env for t in remote} == {"agentgym/textcraft"}
    assert idx == PRESETS["textcraft"].task_indices("test", 6, "stratified-v1")
    old = AgentGymClient(server.url, "textcraft", split_scheme="contiguous", **FAST)  # the old ranges, on request
    assert [t.meta["data_idx"] for t in old.tasks("train", n=2)] == [200, 201]  # train starts past val
    low = min(remote, key=lambda t: t.meta["data_idx"])  # the imitation generates tasks 0..i to reach index i
    # reset by data index lands on the server's task of that index
    assert client.reset(low) == make_env("maze").reset(make_env("maze").tasks("test", n=min(idx) + 1)[-1])
    for task, local_task in zip(old.tasks("test", n=6), make_env("maze").tasks("test", n=6), strict=True):
        assert client.reset(task) == make_env("maze").reset(local_task)
    with pytest.raises(ValueError, match="has no difficulty levels"):
        client.tasks("test", n=1, difficulty=1)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        client.tasks("dev", n=1)
    with pytest.raises(ValueError, match=r"has 100 tasks \(stratified-v1\)"):
        client.tasks("test", n=101)
    client.close()
    assert server.app.live == 0


def test_parallel_clients_on_one_server():
    results: dict[int, bool] = {}
    tasks = make_env("crafting").tasks("val", n=16)

    def worker(k: int) -> None:
        client = AgentGymClient(srv.url, "trajlake", **FAST)
        results[k] = all(expert_transcript(client, t) == expert_transcript(make_env("crafting"), t)
                         for t in tasks[k::4])
        client.close()

    with serve_env("crafting", split="val") as srv:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {0: True, 1: True, 2: True, 3: True} and srv.app.live == 0


# ---- variant shapes ----------------------------------------------------------------------------------------


def shaped_transcript(env, task: Task, local_task: Task, preset: Preset) -> list:
    """The maze expert's episode, its actions cleaned as `preset`'s client cleans them before sending."""
    expert = make_env("maze").expert()
    expert.reset(local_task)
    obs, transcript, done = env.reset(task), [], False
    while not done:
        action = expert.act(obs)
        obs, reward, done, info = env.step(action if isinstance(env, AgentGymClient) else preset.clean_action(action))
        transcript.append((obs, reward, done, info.get("success") if done else None))
        if len(transcript) >= 30:
            break
    return transcript


@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"trajlake"}))
def test_each_preset_against_a_server_shaped_like_it(name):
    # the imitation generates tasks 0..i to reach data index i: low indices keep it fast (splits are tested above)
    preset = dataclasses.replace(PRESETS[name], size=None, splits={"test": (0, 100)}, difficulty_profile=None)
    with serve_env("maze", preset=preset) as srv:
        client = AgentGymClient(srv.url, preset, **FAST)
        local_tasks = make_env("maze").tasks("test", n=3)
        for task, local_task in zip(client.tasks("test", n=3), local_tasks, strict=True):
            first = client.reset(task)
            assert make_env("maze").reset(local_task) in first  # the preset's extras surround the observation
            remote = shaped_transcript(client, task, local_task, preset)
            local = shaped_transcript(make_env("maze"), local_task, local_task, preset)
            # observations, per-step rewards, done, and success as the preset's rule judges it, agree
            assert remote == local
        client.close()
        # servers without /close keep their instances, as AgentGym's do; the others are back to none
        assert srv.app.live == (0 if preset.can_close else 6)


def test_wire_shapes_bare_int_env_idx_state_and_prefix():
    webshop = PRESETS["webshop"]
    with serve_env("guess", preset=webshop) as srv:
        created = requests.post(f"{srv.url}/create", timeout=2).json()
        assert isinstance(created, int)
        reply = requests.post(f"{srv.url}/reset", json={"env_idx": created, "session_id": 0}, timeout=2).json()
        assert set(reply) == {"state", "task_id"}
        # the server is strict about field names, so passing tests mean the client sent env_idx and session_id
        assert requests.post(f"{srv.url}/reset", json={"id": created, "session_id": 0}, timeout=2).json() == \
               {"error": "missing field 'env_idx'"}
        step = requests.post(f"{srv.url}/step", json={"env_idx": created, "action": "guess 1"}, timeout=2).json()
        assert set(step) == {"state", "reward", "done"}  # like AgentGym's servers: no info, no success
        assert requests.get(f"{srv.url}/observation", params={"env_idx": created}, timeout=2).json() == \
               {"state": step["state"]}
        assert requests.get(f"{srv.url}/", timeout=2).json() == "This is environment WebShop."
    with serve_env("guess", preset=PRESETS["weather"]) as srv:  # the tool envs create per task
        assert "missing field 'id'" in requests.post(f"{srv.url}/create", json={}, timeout=2).json()["error"]
    with serve_env("guess", prefix="wordle") as srv:
        assert requests.post(f"{srv.url}/wordle/create", timeout=2).json() == {"id": 0}
        assert requests.post(f"{srv.url}/create", timeout=2).json() == {"id": 1}  # unprefixed routes answer too
        custom = Preset("custom", "Custom", "", "", win_reward_at_least_one, id_field="env_idx", reset_field="item_id",
                        prefix="/wordle/", obs_key="state", create_returns_bare_int=True)
        task = make_env("guess").tasks("test", n=1)[0]
        with pytest.raises(EnvServerError, match="missing field 'id'"):  # this server speaks plain "id"
            AgentGymClient(srv.url, custom, **FAST).reset(dataclasses.replace(task, meta={"data_idx": 0}))
    with serve_env("guess", preset=custom) as srv:  # a server shaped like `custom` plays with it
        client = AgentGymClient(srv.url, custom, **FAST)
        assert client.reset(dataclasses.replace(task, meta={"data_idx": 0})) == make_env("guess").reset(task)
        assert client.env_id == 0 and client._url("step") == f"{srv.url}/wordle/step"
        client.close()
        assert srv.app.live == 0


def test_client_reads_every_observation_shape():
    client = AgentGymClient("http://127.0.0.1:9", PRESETS["sciworld"])
    assert client._obs("bare text", "observation") == "bare text"
    assert client._obs(["webshop text", None], "reset") == "webshop text"
    assert client._obs({"task_description": "Boil water.", "observation": "A kitchen."}, "step") == "A kitchen."
    with pytest.raises(EnvServerError, match="no 'observation'"):
        client._obs({"reward": 0}, "step")
    assert client._created_id(7) == 7 and client._created_id({"env_idx": 3}) == 3
    task = Task(task_id="x/test/17", env="x", seed=5)
    assert task_selector(task) == 17 and task_selector(dataclasses.replace(task, meta={"data_idx": 2})) == 2
    assert task_selector(dataclasses.replace(task, task_id="x")) == 5


# ---- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["doors"], indirect=True)
def test_error_replies_raise_env_server_error_without_retrying(server):
    # a huge backoff: if an error reply were retried, the test would take seconds
    client = AgentGymClient(server.url, "trajlake", timeout=2.0, retries=3, backoff=5.0)
    task = make_env("doors").tasks("test", n=1, difficulty=1)[0]
    start = time.monotonic()
    expert_transcript(client, task)
    with pytest.raises(EnvServerError, match=r"server error: doors: the episode of .* is over") as e:
        client.step("open red")
    assert isinstance(e.value, TrajlakeError) and e.value.status == 200 and server.url in str(e.value)
    client.env_id = 999
    with pytest.raises(EnvServerError, match="server error: the id 999 is not valid"):
        client.step("open red")
    with pytest.raises(EnvServerError, match="server error: unknown route POST /maze/create"):
        AgentGymClient(server.url, "maze", **FAST).reset(task)
    bad_task = dataclasses.replace(task, env="maze")
    with pytest.raises(EnvServerError, match="is for env 'maze', not 'doors'"):
        client.reset(bad_task)
    assert time.monotonic() - start < 2.0
    for body, message in [("{not json", "invalid JSON body"), ("[1, 2]", "invalid JSON body: expected an object"),
                          ('{"id": 0}', "missing field 'action'"), ('{"id": "x", "action": "a"}', "must be an int")]:
        reply = requests.post(f"{server.url}/step", data=body, timeout=2)
        assert reply.status_code == 200 and message in reply.json()["error"]
    assert "unknown route GET /nope" in requests.get(f"{server.url}/nope", timeout=2).json()["error"]
    with pytest.raises(RuntimeError, match="call reset"):
        AgentGymClient(server.url).step("open red")


def test_server_killed_mid_episode_then_a_fresh_one_works(tmp_path):
    code = "from trajlake.collect.envs.agentgym_server import run_server; run_server('guess', '127.0.0.1', 0)"
    with open(tmp_path / "server.log", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        url = proc.stdout.readline().strip().rsplit(" on ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), (tmp_path / "server.log").read_text()
        client = AgentGymClient(url, "trajlake", **FAST)
        task = make_env("guess").tasks("test", n=1, difficulty=3)[0]
        client.reset(task)
        client.step("guess 1")
        assert requests.get(f"{url}/list_envs", timeout=2).json() == [0]
    finally:
        proc.kill()
        proc.wait()
    start = time.monotonic()
    with pytest.raises(EnvServerError, match=r"POST http://127\.0\.0\.1:\d+/step: cannot connect .*after 3 attempts"):
        client.step("guess 2")
    assert time.monotonic() - start < 1.5
    client.close()  # closing on a dead server is best effort: no error
    assert "POST /step -> ok" in (tmp_path / "server.log").read_text()  # run_server logs each request
    with serve_env("guess") as srv:
        client.url = srv.url
        assert expert_transcript(client, task) == expert_transcript(make_env("guess"), task)
        client.close()
        assert srv.app.live == 0


class SlowMaze(MazeEnv):
    """A maze whose reset and step take longer than the test client waits; counts how often each was asked."""

    delay = 0.4
    calls = {"reset": 0, "step": 0}

    def reset(self, task):
        SlowMaze.calls["reset"] += 1
        time.sleep(self.delay)
        return super().reset(task)

    def step(self, action):
        SlowMaze.calls["step"] += 1
        time.sleep(self.delay)
        return super().step(action)


def test_timeouts_are_retried_a_bounded_number_of_times_and_steps_never():
    SlowMaze.calls = {"reset": 0, "step": 0}
    task = make_env("maze").tasks("test", n=1)[0]
    with serve_env(SlowMaze) as srv:
        client = AgentGymClient(srv.url, "trajlake", timeout=0.15, connect_timeout=1.0, retries=2, backoff=0.05)
        start = time.monotonic()
        with pytest.raises(EnvServerError, match=r"/reset: no reply within 0\.15s \(after 3 attempts\)"):
            client.reset(task)
        assert 0.45 <= time.monotonic() - start < 1.2
        # the retries queue on the instance's lock behind the first, so the third starts only after the second
        deadline = time.monotonic() + 2
        while SlowMaze.calls["reset"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert SlowMaze.calls["reset"] == 3
        client.timeout = 2.0
        client.reset(task)
        client.timeout = 0.15
        with pytest.raises(EnvServerError, match=r"/step: no reply within 0\.15s; not retried"):
            client.step("move north")
        assert SlowMaze.calls["step"] == 1
        client.timeout = 2.0
        client.close()
        time.sleep(0.1)
        assert srv.app.live == 0


def test_busy_server_503_is_asked_again_and_a_prefixed_url_is_accepted():
    """WebShop's server answers 503 when busy (its own client asks again); LMRL-Gym's README gives the maze
    server's URL with the prefix already on it."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls = []

    class Busy(BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = (503, b"busy") if len(calls) <= 2 else (200, b"7")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # no request lines on stderr
            return None

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        client = AgentGymClient(url, "webshop", **FAST)
        assert client._request("POST", "create", idempotent=False) == 7 and calls == ["/create"] * 3
        calls.clear()
        client.retries = 1
        with pytest.raises(EnvServerError, match=r"/create: HTTP 503 \(busy\) \(after 2 attempts\)"):
            client._request("POST", "create", idempotent=False)
    finally:
        srv.shutdown()
        srv.server_close()
    maze = AgentGymClient("http://127.0.0.1:9/maze/", "maze")
    assert maze._url("step") == "http://127.0.0.1:9/maze/step"
    assert AgentGymClient("http://127.0.0.1:9", "maze")._url("step") == "http://127.0.0.1:9/maze/step"


def test_scripted_expert_of_another_env_is_refused_on_a_served_task(tiny, tmp_path, capsys):
    """trajlake's own server plays stored tasks of the env it serves: scripted:ENV must name that env."""
    from trajlake.cli import main

    with serve_env("crafting") as srv:
        argv = ["--lake", str(tmp_path / "lake"), "collect", "--env", "agentgym", "--env-url", srv.url,
                "--tokenizer", str(tiny), "--tasks", "2", "--split", "test"]
        assert main([*argv, "--policy", "scripted:maze"]) == 1
        err = capsys.readouterr().err
        assert "scripted:maze plays maze tasks, not 'crafting'" in err and "Traceback" not in err
        assert main([*argv, "--policy", "scripted:crafting", "--run-id", "ok"]) == 0


def test_cumulative_progress_wins_at_full_progress_whatever_the_last_increase():
    """The tool envs' reward is the progress so far: a win reached in two halves is still a win, and each
    step's stored reward is its increase, so an episode's rewards add up to its progress."""
    from trajlake.collect.envs.agentgym_protocol import StepReply

    weather = PRESETS["weather"]
    assert weather.success(StepReply(reward=0.5, done=True, score=1.0, observation="done"))
    assert not weather.success(StepReply(reward=0.5, done=True, score=0.5, observation="done"))
    with serve_env("guess", preset=weather) as srv:
        client = AgentGymClient(srv.url, weather, **FAST)
        task = client.tasks("test", n=1)[0]
        client.reset(task)
        total = 0.0
        for guess in range(1, 40):
            obs, reward, done, info = client.step(f"guess {guess}")
            total += reward
            assert info["score"] == pytest.approx(total)  # the progress is the sum of the increases
            if done:
                break
        client.close()
