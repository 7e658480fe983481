"""The recipes' shared entry (recipes/entry.py): a refused setting is one error line, and a recipe stopped with
SIGTERM runs its cleanups, so the real TextCraft server it started does not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import requests

from tests.conftest import require_textcraft_server
from trajlake.core.errors import TrajlakeError
from trajlake.recipes.entry import run_recipe


def test_a_refused_config_is_one_error_line(capsys):
    def refuse():
        raise TrajlakeError("demo: sft_steps must be >= 1, got -3")

    assert run_recipe(lambda cfg: None, refuse) == 1
    assert capsys.readouterr().err == "error: demo: sft_steps must be >= 1, got -3\n"


def test_sigterm_stops_the_server_the_recipe_started(tmp_path):
    require_textcraft_server()
    script = textwrap.dedent(f"""
        import time
        from trajlake.collect.envs.agentgym_launch import textcraft_server
        from trajlake.recipes.entry import run_recipe

        def run(cfg):
            with textcraft_server(log={str(tmp_path / 'server.log')!r}) as server:
                print(server.url, flush=True)
                time.sleep(600)

        raise SystemExit(run_recipe(run, lambda: None))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert requests.get(url, timeout=10).ok  # the server is up
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=2)
        except requests.ConnectionError:
            return  # stopped with the recipe
        time.sleep(0.5)
    raise AssertionError(f"the TextCraft server at {url} outlived the recipe")
