"""A run that evaluates as it goes stops below its start's interval and stays stopped; its best checkpoint on the
eval split is a query; SFT's plateau is where val stopped improving, not where the step budget ran out."""

from __future__ import annotations

import pytest

from tests.helpers import small_cfg
from trajlake.recipes.plateau import plateau_reached, plateau_steps
from trajlake.train import loop
from trajlake.train.eval_guard import EvalPoint, best_eval_policy, eval_points, regression, stopped_reason


def test_regression_is_a_drop_below_the_starts_wilson_interval():
    start = EvalPoint(0, 0.5, 100)
    low, high = start.interval
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)
    assert regression(start, EvalPoint(3, 0.41, 100)) is None  # within the start's own noise
    why = regression(start, EvalPoint(3, 0.39, 100))
    assert why.startswith("eval success 0.39 at step 3 fell below the starting policy's 95% interval [0.40, 0.60]")
    assert regression(None, EvalPoint(3, 0.0, 100)) is None
    assert regression(EvalPoint(0, 0.5, 0), EvalPoint(1, 0.0, 9)) is None  # a start without episodes
    # the TextCraft run: 0.40 on 30 goals after SFT, 0.10 after GRPO
    assert regression(EvalPoint(0, 0.40, 30), EvalPoint(5, 0.10, 30)) is not None


def test_plateau_rule():
    assert plateau_steps(100, 600) == [100, 200, 300, 400, 500, 600] and plateau_steps(100, 250) == [100, 200, 250]
    assert plateau_reached({100: 0.1, 200: 0.2}, 2) is None  # still rising
    assert plateau_reached({100: 0.1, 200: 0.2, 300: 0.2, 400: 0.15}, 2) == 200  # equal is no gain
    assert plateau_reached({100: 0.1, 200: 0.2, 300: 0.2, 400: 0.25}, 2) is None
    # the TextCraft "plateau" of the old recipe: 0.17 at step 10, 0.23 at step 20, and no later checkpoint
    assert plateau_reached({10: 0.17, 20: 0.23}, 1) is None


@pytest.fixture
def scripted_evals(monkeypatch):
    """The train loop's held-out evals answer with given success rates (100 episodes each), so the stop rule is
    tested on known numbers; the evals themselves are tested in test_train_loop and test_evaluate."""
    rates: list[float] = []

    def evaluate(r, engines, policy_id, path, step):
        return {"eval_success": rates[step], "eval_env_reward": 0.0, "eval_episodes": 100}

    monkeypatch.setattr(loop, "evaluate", evaluate)
    return rates


def _cfg(tiny, run_id, **kw):
    return small_cfg(tiny, run_id=run_id, tasks=2, samples=2, minibatch_size=4, micro_batch=2, eval_every=1, **kw)


def test_a_run_below_its_start_stops_and_stays_stopped(tiny, lake, scripted_evals, capsys):
    scripted_evals += [0.5, 0.45, 0.2, 0.6]
    res = loop.train(_cfg(tiny, "reg", iterations=3), lake)
    assert res.step == 2  # iteration 2's eval (0.20) fell below [0.40, 0.60]: no third iteration
    assert "stopping: eval success 0.20 at step 2 fell below" in capsys.readouterr().err
    assert stopped_reason(lake, "reg").startswith("eval success 0.20 at step 2")
    assert lake.query("SELECT status FROM runs WHERE run_id = 'reg'")["status"][0] == "finished"
    assert [(p.step, p.success) for p in eval_points(lake, "reg")] == [(0, 0.5), (1, 0.45), (2, 0.2)]
    best = best_eval_policy(lake, "reg")
    assert (best.step, best.policy_id) == (1, "reg/step-1")
    # restarted (even asked for more iterations), it trains no further
    res = loop.train(_cfg(tiny, "reg", iterations=4), lake)
    assert res.step == 2 and "stopped earlier: eval success 0.20" in capsys.readouterr().err


def test_the_stop_can_be_turned_off(tiny, lake, scripted_evals):
    scripted_evals += [0.5, 0.2, 0.3]
    assert loop.train(_cfg(tiny, "free", iterations=2, stop_on_regression=False), lake).step == 2
    assert stopped_reason(lake, "free") is None and best_eval_policy(lake, "free").step == 2
