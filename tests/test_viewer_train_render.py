"""The train pages' pure parts (view/train_pages.py, train_data.py) on hand-made rows: a train
run's lineage (its checkpoints, the policy it started from, their ancestors, a cycle), which evals it shows and
in what order, wins and losses per task, the evals compared side by side when there are many, and its config
against the defaults stored with it."""

from __future__ import annotations

from trajlake.core.config_types import DEFAULTS_KEY, REQUIRED, stored_defaults
from trajlake.view.evals import MAX_COMPARED, compared, headline, tasks_table, versus
from trajlake.view.pages import Links
from trajlake.view.train_data import EvalGroup, PolicyEval, _evals_of, lineage
from trajlake.view.train_pages import config_block, config_rows


def pol(pid, run=None, step=None, parent=None):
    return {"policy_id": pid, "run_id": run, "step": step, "parent_policy_id": parent}


POLICIES = {p["policy_id"]: p for p in [
    pol("base"), pol("sft/1", "sft", 1, "base"), pol("sft/2", "sft", 2, "sft/1"),
    pol("g/1", "g", 1, "sft/2"), pol("g/2", "g", 2, "g/1"), pol("g-start", "g"),  # the run's start row: no step
    pol("loop-a", "loop", 1, "loop-b"), pol("loop-b", "x", None, "loop-a")]}


def ev(run, policy, tasks, *, parent=None, env="doors", split="test", started=0):
    return PolicyEval(run, parent, started, policy, env, split, tasks)


def test_lineage_roles_steps_and_depths():
    roles = lineage(POLICIES, "g", "sft/2")
    assert roles == {"g/1": ("own", 1.0, 0), "g/2": ("own", 2.0, 0), "sft/2": ("start", 0.0, 1),
                     "sft/1": ("ancestor", None, 2), "base": ("ancestor", None, 3)}
    assert lineage(POLICIES, "fresh", "sft/1") == {"sft/1": ("start", 0.0, 1), "base": ("ancestor", None, 2)}
    assert set(lineage(POLICIES, "loop", None)) == {"loop-a", "loop-b"}  # a cycle stops


def test_which_evals_a_run_shows_and_their_order():
    t = {"t1": (1, 1, "e1")}
    results = [ev("e-g2", "g/2", t, started=5), ev("e-base", "base", t, started=1), ev("e-sft2", "sft/2", t, started=2),
               ev("g/eval-7", "unknown", t, parent="g", started=3),
               ev("e-anc-val", "sft/1", t, split="val"),  # an ancestor's eval alone: its group is not shown
               ev("e-other", "other", t)]
    groups = _evals_of(results, "g", lineage(POLICIES, "g", None))
    assert [(g.env, g.split) for g in groups] == [("doors", "test")]
    order = [(e.eval_run, e.role, e.x) for e in groups[0].evals]
    assert order == [("e-base", "ancestor", None), ("e-sft2", "start", 0.0), ("e-g2", "own", 2.0),
                     ("g/eval-7", "eval", 7.0)]
    a, b = headline(groups[0])
    assert (a.eval_run, b.eval_run) == ("e-sft2", "g/eval-7")  # the last against the start


def test_wins_and_losses_per_task():
    a = ev("a", "p", {"t0": (1, 0, "a0"), "t1": (1, 1, "a1"), "t2": (1, 0, "a2"), "t3": (2, 1, "a3"),
                      "t4": (1, 1, "a4")})
    b = ev("b", "q", {"t0": (1, 0, "b0"), "t1": (1, 0, "b1"), "t2": (1, 1, "b2"), "t3": (2, 1, "b3"),
                      "t5": (1, 1, "b5")})
    assert versus(a, b) == (4, 1, 1, 2) and versus(b, a) == (4, 1, 1, 2)
    table = tasks_table([a, b], Links(static=False), None, 0, "tasks")
    rows = table.split("<tr data-task=")[1:]
    assert [r.split('"')[1] for r in rows] == ["t1", "t2", "t0", "t3", "t4", "t5"]  # where they differ first
    assert "2 of 6 tasks with different results" in table  # t4 and t5: played by one only, nothing to differ
    assert '<td class="part"><a href="/episode?id=a3" title="a3">1/2</a></td>' in table
    assert rows[0].count("✓") == 1 and rows[0].count("✗") == 1


def test_many_evals_compare_the_baselines_the_first_and_the_last():
    t = {"t": (1, 1, "e")}
    evals = [ev("base", "b", t)] + [ev(f"own-{i}", f"p{i}", t) for i in range(20)]
    evals[0] = PolicyEval(**{**evals[0].__dict__, "role": "start"})
    got = compared(evals)
    assert len(got) == MAX_COMPARED and got[0].eval_run == "base"
    assert got[1].eval_run == "own-0" and got[-1].eval_run == "own-19"
    assert compared(evals[:3]) == evals[:3]
    assert headline(EvalGroup("doors", "test", evals[:1])) is None


def test_config_rows_differ_from_the_defaults_stored_with_the_run():
    """The defaults a config is compared with are those stored with it (the code that ran it), not this code's."""
    from trajlake.train.config import TrainConfig

    defaults = stored_defaults(TrainConfig)
    assert defaults["model"] == REQUIRED and defaults["report_to"] == []
    old = {**defaults, "lr": 2e-6}  # an earlier trajlake's default, say
    differs, recorded, same = config_rows({"lr": 2e-6, "model": "m", "report_to": ["tensorboard"], "start_policy": "p",
                                           "tasks": 16, "iterations": 3, DEFAULTS_KEY: old})
    assert [k for k, _, _ in differs] == ["iterations", "model", "report_to"]
    assert [k for k, _, _ in recorded] == ["start_policy"] and [k for k, _, _ in same] == ["lr", "tasks"]
    assert config_rows({"lr": 2e-6}) is None  # a run stored before its defaults were
    page = config_block({"lr": 2e-6, "model": "m"})
    assert "stored before trajlake recorded its defaults" in page and "lr" in page and "differ" not in page


def run_row(run_id, kind, episodes, success_rate, parent=None):
    return {"run_id": run_id, "kind": kind, "status": "finished", "parent_run_id": parent, "episodes": episodes,
            "success_rate": success_rate, "envs": "doors", "policies": "p", "started_at": "t"}


def test_run_list_says_why_an_import_has_no_success_rate():
    """An import of a file without success flags says so; a collect run with no outcome yet stays blank, and an
    import that has one shows its rate."""
    from trajlake.store.reads import NO_OUTCOME
    from trajlake.view.render import runs_page

    html = runs_page([run_row("imp", "import", 12, None), run_row("imp2", "import", 4, 0.5),
                      run_row("col", "collect", 3, None), run_row("empty", "import", 0, None)], 1, Links(True), None)
    cells = {r: html.split(f'data-run="{r}"', 1)[1].split("</tr>", 1)[0] for r in ("imp", "imp2", "col", "empty")}
    assert NO_OUTCOME in cells["imp"] and "<td>0.5</td>" in cells["imp2"]
    assert NO_OUTCOME not in cells["col"] and NO_OUTCOME not in cells["empty"] and NO_OUTCOME not in cells["imp2"]
