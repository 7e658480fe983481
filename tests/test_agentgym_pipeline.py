"""`make agentgym-pipeline` end to end on AgentGym's real TextCraft server, at a tiny scale (slow: it trains)."""

from __future__ import annotations

import pytest

from trajlake.collect.envs.agentgym_launch import server_missing_reason
from trajlake.recipes.agentgym_pipeline import DEFAULT_DATA, main
from trajlake.store import Lake


def test_bad_options_stop_before_any_work(tmp_path, capsys):
    assert main(["--lake", str(tmp_path / "lake"), "--data", str(tmp_path / "none.parquet")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: agentgym pipeline: no AgentGym TextCraft trajectories at") and "\n" not in err
    assert main(["--lake", str(tmp_path / "lake"), "--iterations", "0"]) == 1
    assert "iterations must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "lake").exists()


@pytest.mark.slow
def test_the_pipeline_runs_on_the_real_server(tmp_path, monkeypatch, textcraft_url):
    if not DEFAULT_DATA.is_file() or server_missing_reason():
        pytest.skip(f"needs {DEFAULT_DATA} and AgentGym's TextCraft server")
    monkeypatch.chdir(tmp_path)
    uri = str(tmp_path / "lake")
    argv = ["--lake", uri, "--env-url", textcraft_url, "--sft-steps", "2", "--iterations", "1", "--tasks", "2",
            "--samples", "2", "--micro-batch", "2", "--max-turns", "3", "--eval-tasks", "2"]
    assert main(argv) == 0
    with Lake.open(uri) as lake:
        runs = dict(lake.query("SELECT run_id, status FROM runs").iter_rows())
        assert runs["agentgym-sft"] == "finished" and runs["agentgym-grpo"] == "finished"
        assert any(r.startswith("import-agentgym-") for r in runs)
        played = lake.query("SELECT env, status, count(*) AS n FROM episodes WHERE run_id NOT LIKE 'import-%' "
                            "GROUP BY ALL")
        assert set(played["env"]) == {"agentgym/textcraft"} and "error" not in set(played["status"])
        evals = lake.query("SELECT DISTINCT policy_id FROM episodes e JOIN runs r USING (run_id) "
                           "WHERE r.kind = 'eval'")
        assert evals.height == 3  # the start, the SFT and the GRPO policies, on the same held-out tasks
        assert lake.query("SELECT count(*) AS n FROM train_steps WHERE run_id = 'agentgym-grpo'")["n"][0] >= 1
        # held out: no evaluated task shares a goal with an imported episode the policies trained on
        assert lake.query("SELECT max(contaminated_tasks) AS k FROM eval_contamination")["k"][0] == 0
    assert main(argv) == 0  # a second run resumes: nothing to redo, the same results
