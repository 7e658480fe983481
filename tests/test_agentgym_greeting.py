"""An AgentGym env played only against a server that greets as that environment (or names none).

`--env agentgym/babyai --env-url URL` of a TextCraft server used to play TextCraft's games as BabyAI and store
its wins as failures. Now the client reads the server's greeting (`GET /`) before anything is stored and
refuses, in one line, a server that names another environment; a server that names none is still played.
The real-server tests use AgentGym's own TextCraft server (fixture `textcraft_url`, tests/conftest.py); the
others trajlake's server (`trajlake serve-env`, here `serve_env`) imitating a preset's greeting.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest

from tests.helpers import cfg, episodes_of
from trajlake.collect.envs import make_env
from trajlake.collect.envs.agentgym_client import EnvServerError, detect_preset, greets_as, named_presets
from trajlake.collect.envs.agentgym_presets import PRESETS
from trajlake.collect.envs.agentgym_server import serve_env
from trajlake.collect.rollout import collect
from trajlake.store import Lake

FAST = {"timeout": 5.0, "connect_timeout": 1.0, "retries": 1, "backoff": 0.05}


def counts(lake: Lake) -> tuple[int, int]:
    """(runs, episodes) the lake holds."""
    return (lake.query("SELECT count(*) AS n FROM runs")["n"][0],
            lake.query("SELECT count(*) AS n FROM episodes")["n"][0])


# ---- against AgentGym's real TextCraft server ---------------------------------------------------------------


def test_another_env_on_the_real_server_is_refused_before_anything_is_stored(textcraft_url, tiny, tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        config = cfg(env="agentgym/babyai", env_url=textcraft_url, policy=f"hf:{tiny}", tasks=2, run_id="wrong")
        with pytest.raises(EnvServerError) as e:
            collect(config, lake)
        message = str(e.value)
        assert len(message.splitlines()) == 1
        assert "agentgym/babyai wants a BabyAI server" in message and "'This is environment TextCraft.'" in message
        assert f"server at {textcraft_url} greets" in message and "pass --env agentgym/textcraft instead" in message
        assert counts(lake) == (0, 0)


def test_the_right_env_on_the_real_server_plays(textcraft_url, tiny, tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        run_id = collect(cfg(env="agentgym/textcraft", env_url=textcraft_url, policy="scripted",
                             tokenizer=str(tiny), tasks=1, max_turns=30, run_id="right"), lake)
        eps = episodes_of(lake, run_id)
        assert eps.height == 1 and eps["success"].all() and set(eps["status"]) == {"ok"}
    env = make_env("agentgym/textcraft", url=textcraft_url, **FAST)
    env.check_server()  # the greeting names TextCraft: accepted


def test_the_cli_prints_one_error_line_for_another_env(textcraft_url, tiny, tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "cli-lake")
    assert main(["--lake", uri, "collect", "--env", "agentgym/babyai", "--env-url", textcraft_url,
                 "--policy", f"hf:{tiny}", "--tasks", "1", "--run-id", "wrong-cli"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in captured.err
    assert "agentgym/babyai wants a BabyAI server" in lines[0] and "TextCraft" in lines[0]
    assert "--env agentgym/textcraft" in lines[0]
    with Lake.open(uri) as lake:
        assert counts(lake) == (0, 0)


# ---- against trajlake's own server, imitating a preset ------------------------------------------------------


def test_a_server_imitating_another_preset_is_refused():
    with serve_env("maze", preset=PRESETS["babyai"]) as srv:  # greets "This is environment BabyAI."
        env = make_env("agentgym/textcraft", url=srv.url, **FAST)
        with pytest.raises(EnvServerError, match=r"^env agentgym/textcraft wants a TextCraft server, but the "
                           r"server at \S+ greets 'This is environment BabyAI.': pass --env agentgym/babyai "
                           r"instead \(or the --env-url of a TextCraft server\)$"):
            env.check_server()
        assert srv.app.live == 0  # nothing was created on the server
        make_env("agentgym/babyai", url=srv.url, **FAST).check_server()  # its own env is accepted

    with serve_env("maze", preset=PRESETS["maze"]) as srv:  # LMRL-Gym serves maze and wordle alike
        with pytest.raises(EnvServerError, match="pass --env agentgym/maze or --env agentgym/wordle instead"):
            make_env("agentgym/sciworld", url=srv.url, **FAST).check_server()
        make_env("agentgym/wordle", url=srv.url, **FAST).check_server()  # the title is wordle's too


def test_trajlake_greeting_and_a_greeting_naming_nothing_are_accepted():
    with serve_env("maze") as srv:  # trajlake's own shape greets "This is trajlake env maze."
        make_env("agentgym/trajlake", url=srv.url, **FAST).check_server()
        with pytest.raises(EnvServerError, match="pass --env agentgym/trajlake instead"):
            make_env("agentgym/babyai", url=srv.url, **FAST).check_server()

    quiet = dataclasses.replace(PRESETS["textcraft"], title="ok")  # a server that says little: "... ok."
    with serve_env("maze", preset=quiet) as srv:
        env = make_env("agentgym/textcraft", url=srv.url, **FAST)
        env.check_server()
        assert env.reset(env.tasks("test", n=1)[0])  # and it plays
        env.close()


def test_the_check_is_done_once_per_url_and_an_unreachable_server_fails_as_requests_do():
    with serve_env("maze", preset=PRESETS["textcraft"]) as srv:
        env = make_env("agentgym/textcraft", url=srv.url, **FAST)
        env.check_server()
    env.check_server()  # the server is gone, but this URL was checked already
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        env.url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(EnvServerError, match=r"^GET http://127\.0\.0\.1:\d+/: cannot connect .*\(after 2 attempts\)$"):
        env.check_server()


def test_greeting_matching_is_shared_with_detect_preset():
    assert [p.name for p in named_presets("This is environment TextCraft.")] == ["textcraft"]
    assert [p.name for p in named_presets("Welcome to LMRL-Gym")] == ["maze", "wordle"]
    assert named_presets("ok") == [] and named_presets("TextCraftX, BabyAIs") == []
    assert greets_as("this is environment textcraft", "TextCraft")  # any case
    with serve_env("maze", preset=PRESETS["babyai"]) as srv:
        assert detect_preset(srv.url) == "babyai"
