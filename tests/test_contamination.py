"""Contamination measured by the store: an evaluation's tasks that share a task id or a goal with any episode in
the evaluated policy's lineage (its own run's steps up to it, its ancestors' runs), on every catalog backend; and
end to end, a policy trained on test tasks is labelled not held out by `trajlake evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import SYSTEM, small_cfg
from trajlake.cli import app
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.evaluate.contamination import contamination, contamination_notes, with_contamination
from trajlake.evaluate.metrics import summarize
from trajlake.schemas.records import Episode, Policy, Run, Task, TrainStep, Turn
from trajlake.store import Lake
from trajlake.train.loop import train

QUERY = Path(__file__).resolve().parent.parent / "docs" / "queries" / "contamination.sql"


def _commands(*lines: str) -> str:
    return "Crafting commands:\n" + "\n".join(lines)


def _episode(eid: str, run: str, policy: str, task: str, env: str, first_obs: str, success: bool | None = True,
             status: str = "ok") -> tuple[Episode, Turn]:
    return (Episode(eid, run_id=run, policy_id=policy, task_id=task, env=env, status=status, success=success,
                    num_turns=1),
            Turn(eid, 0, observation=first_obs, action_text="get 1 stick", action="get 1 stick", format_ok=True))


def _seed(lake: Lake) -> None:
    """An SFT on imported demonstrations, a GRPO run from it, and evaluations of each and of the base model."""
    rows = [
        # imported demonstrations (env `textcraft`, as OpenManus-RL's files name it): blue dye, red dye
        _episode("d1", "import", "expert", "train/textcraft_31", "textcraft",
                 "Instruction:\n" + _commands("craft 1 blue dye using 1 lapis", "craft 4 stick using 2 planks")
                 + "\n\nGoal: craft blue dye."),
        _episode("d2", "import", "expert", "train/textcraft_40", "textcraft",
                 _commands("craft 1 red dye using 1 poppy") + "\n\nGoal: craft red dye."),
        # GRPO rollouts on the server's train split: step 1 plays stick, step 2 plays gold ingot
        _episode("r1", "grpo/it-1", "sft/step-10", "agentgym/textcraft/train/300", "agentgym/textcraft",
                 _commands("craft 4 stick using 2 planks") + "\n\nGoal: craft stick."),
        _episode("r2", "grpo/it-2", "grpo/step-1", "agentgym/textcraft/train/301", "agentgym/textcraft",
                 _commands("craft 1 gold ingot using 9 gold nugget") + "\n\nGoal: craft gold ingot."),
    ]
    tests = [("t0", "blue dye", ("craft 9 lapis using 1 lapis block", "craft 1 blue dye using 1 lapis"), True),
             ("t1", "stick", ("craft 4 stick using 2 planks",), True),
             ("t2", "gold ingot", ("craft 1 gold ingot using 9 gold nugget",), False),
             ("t3", "torch", ("craft 4 torch using 1 coal, 1 stick",), False)]
    for run, policy in (("eval-grpo1", "grpo/step-1"), ("eval-base", "base"), ("eval-sft", "sft/step-10")):
        for i, (t, goal, lines, won) in enumerate(tests):
            # the same goal with its commands in another order: the env's own variable part
            obs = "Craft the goal item.\n" + _commands(*reversed(lines)) + f"\n\nGoal: craft {goal}."
            rows.append(_episode(f"{run}-{t}", run, policy, f"agentgym/textcraft/test/{i}", "agentgym/textcraft",
                                 obs, won))
    # an env error says nothing of the policy: left out
    rows.append(_episode("eval-grpo1-err", "eval-grpo1", "grpo/step-1", "agentgym/textcraft/test/9",
                         "agentgym/textcraft", "Goal: craft blue dye.", None, status="error"))
    runs = [Run(r, k) for r, k in (("import", "import"), ("sft", "train"), ("grpo", "train"), ("grpo/it-1", "collect"),
                                   ("grpo/it-2", "collect"), ("eval-grpo1", "eval"), ("eval-base", "eval"),
                                   ("eval-sft", "eval"))]
    policies = [Policy("expert"), Policy("base"), Policy("sft/step-10", run_id="sft", step=10),
                Policy("grpo/step-1", run_id="grpo", step=1, parent_policy_id="sft/step-10"),
                Policy("grpo/step-2", run_id="grpo", step=2, parent_policy_id="grpo/step-1"),
                # a cycle a hand-edited lake might hold must not hang the query
                Policy("loop-a", run_id="loop", step=1, parent_policy_id="loop-b"),
                Policy("loop-b", run_id="loop", step=2, parent_policy_id="loop-a")]
    steps = [TrainStep("sft", 10, episode_ids=("d1", "d2")), TrainStep("grpo", 1, episode_ids=("r1",)),
             TrainStep("grpo", 2, episode_ids=("r2",))]
    tasks = [Task(f"agentgym/textcraft/test/{i}", "agentgym/textcraft", split="test") for i in range(4)]
    lake.append({"runs": runs, "policies": policies, "train_steps": steps, "tasks": tasks,
                 "episodes": [e for e, _ in rows], "turns": [t for _, t in rows]}, stage="test", message="seed")


def test_lineage_reaches_ancestors_and_stops_at_the_policys_step(lake):
    _seed(lake)
    got = lake.query("SELECT policy_id, list(episode_id ORDER BY episode_id) AS eps FROM policy_training_episodes "
                     "GROUP BY policy_id ORDER BY policy_id").rows()
    assert dict(got) == {"sft/step-10": ["d1", "d2"], "grpo/step-1": ["d1", "d2", "r1"],
                         "grpo/step-2": ["d1", "d2", "r1", "r2"]}
    goals = dict(lake.query("SELECT episode_id, goal FROM episode_goals WHERE family = 'textcraft'").rows())
    assert goals["d1"] == goals["eval-grpo1-t0"] == "craft blue dye" and goals["r1"] == "craft stick"


def test_each_evaluation_counts_the_tasks_its_policy_trained_on(lake):
    _seed(lake)
    rows = {r["eval_run"]: r for r in contamination(lake, ["eval-grpo1", "eval-base", "eval-sft"]).iter_rows(
        named=True)}
    # grpo/step-1 trained on blue dye (its SFT parent's import) and stick (its own step 1), not gold ingot (step 2)
    g = rows["eval-grpo1"]
    assert (g["tasks"], g["contaminated_tasks"], g["episodes"], g["successes"]) == (4, 2, 4, 2)
    assert (g["clean_tasks"], g["clean_episodes"], g["clean_successes"], g["clean_success_rate"]) == (2, 2, 0, 0.0)
    assert (rows["eval-sft"]["contaminated_tasks"], rows["eval-sft"]["clean_success_rate"]) == (1, 0.333)
    assert (rows["eval-base"]["contaminated_tasks"], rows["eval-base"]["clean_success_rate"]) == (0, 0.5)


def test_the_evaluated_policies_lineage_is_the_views_rows_for_them(lake):
    """eval_contamination follows the lineage of the evaluated policies alone (the view's rows for every policy
    grow with steps x episodes): the same rows as the policy_training_episodes view gives for them."""
    from trajlake.schemas.lineage_views import training_episodes_sql

    _seed(lake)
    evaluated = "SELECT DISTINCT policy_id FROM episodes JOIN runs USING (run_id) WHERE kind = 'eval'"
    own = lake.query(f"SELECT * FROM ({training_episodes_sql(evaluated)}) ORDER BY ALL").rows()
    view = lake.query(f"SELECT * FROM policy_training_episodes WHERE policy_id IN ({evaluated}) ORDER BY ALL").rows()
    assert own == view and {p for p, _, _ in own} == {"grpo/step-1", "sft/step-10"}


def test_the_cookbook_query_is_the_same_numbers(lake):
    _seed(lake)
    got = {r["eval_run"]: r["contaminated_tasks"] for r in lake.query(QUERY.read_text()).iter_rows(named=True)}
    assert got == {"eval-grpo1": 2, "eval-base": 0, "eval-sft": 1}


def test_summaries_are_labelled_and_noted(tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        _seed(lake)
        eps = lake.query("SELECT e.run_id AS policy, e.env, e.task_id, e.success, NULL::DOUBLE AS reward, "
                         "e.num_turns, 0 AS format_errors, 1 AS turns_played, 0 AS agent_tokens, "
                         "'all' AS difficulty FROM episodes e WHERE e.run_id LIKE 'eval-%' AND e.status = 'ok'")
        summary = summarize(eps, ["policy", "env", "difficulty"], [1])
        table = with_contamination(lake, summary, {"eval-grpo1": "eval-grpo1", "eval-base": "eval-base"})
    by = {r["policy"]: r for r in table.iter_rows(named=True)}
    assert by["eval-grpo1"]["contaminated_tasks"] == 2 and by["eval-base"]["contaminated_tasks"] == 0
    assert by["eval-sft"]["contaminated_tasks"] is None  # not asked for
    assert by["eval-grpo1"]["clean_success_high"] > 0  # Wilson's interval of 0 of 2
    notes = contamination_notes(table)
    assert len(notes) == 1 and notes[0].startswith("eval-grpo1: 2 of 4 agentgym/textcraft tasks share a goal")
    assert "success on the 2 clean tasks: 0.00" in notes[0]


@pytest.mark.slow
def test_evaluate_labels_a_policy_trained_on_its_test_tasks(tmp_path, tiny):
    """SFT on expert episodes of the doors test split: evaluated on test it is not held out (every task shares
    its id with a trained-on episode); on val it is clean."""
    lake_dir = tmp_path / "lake"
    with Lake.open(str(lake_dir)) as lake:
        collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(tiny), tasks=4, difficulty=1,
                              split="test", template="action", system_prompt=SYSTEM, run_id="leak",
                              progress=False), lake)
        train(small_cfg(tiny, algo="sft", sft_steps=1, minibatch_size=4, run_id="sft-leak",
                        sft_filter="run_id = 'leak'"), lake)
    runner = CliRunner()
    common = ["--lake", str(lake_dir), "evaluate", "--env", "doors", "--policy", "run:sft-leak", "--tasks", "4",
              "--difficulty", "1", "--template", "action", "--system-prompt", SYSTEM, "--greedy",
              "--max-new-tokens", "12"]
    test = runner.invoke(app, [*common, "--split", "test"])
    assert test.exit_code == 0, test.output
    assert "NOT CLEAN: 4 of 4 tasks trained on" in test.output
    assert "share a goal with episodes its lineage trained on" in test.output and "no task is clean" in test.output
    val = runner.invoke(app, [*common, "--split", "val"])
    assert val.exit_code == 0, val.output
    assert "clean" in val.output and "NOT CLEAN" not in val.output
    with Lake.open(str(lake_dir)) as lake:
        rows = lake.query(QUERY.read_text()).select("split", "contaminated_tasks").rows()
    assert sorted(rows) == [("test", 4), ("val", 0)]


def test_the_query_file_is_documented():
    assert QUERY.is_file() and "contamination.sql" in (QUERY.parent / "README.md").read_text()
    assert json.dumps(QUERY.read_text())  # plain text, runs as is (test_cookbook runs every file)


def test_training_data_can_be_restricted_to_goals_outside_the_held_out_tasks(lake):
    """Imported demonstrations of a held-out goal (blue dye, a test task's goal) are left out of SFT's filter;
    those of other goals stay."""
    from trajlake.evaluate.contamination import outside_goals_of

    _seed(lake)
    kept = lake.query(f"SELECT episode_id FROM episodes WHERE run_id = 'import' AND {outside_goals_of()} "
                      "ORDER BY episode_id")["episode_id"].to_list()
    assert kept == ["d2"]
    assert outside_goals_of(("val",)).endswith("WHERE t.split IN ('val'))")


def test_a_made_tasks_goal_is_its_whole_task_not_its_first_room(lake):
    """doors shows only its first room in its first observation: two tasks that open alike but hide other keys
    are different goals; the same task content under another id is the same goal."""
    first_room = "Pass 2 rooms. Room 1 of 2. Four doors: red, pink, purple, black. A sign is here."
    truths = {"doors/train/3/0": "pink", "doors/test/3/0": "red", "doors/test/3/1": "pink"}
    tasks = [Task(t, "doors", split=t.split("/")[1], instruction="Pass 2 rooms.",
                  ground_truth={"rooms": [{"doors": ["red", "pink", "purple", "black"], "key": key}]})
             for t, key in truths.items()]
    rows = [_episode(f"e{i}", "play", "p", t, "doors", first_room) for i, t in enumerate(truths)]
    lake.append({"runs": [Run("play", "collect")], "policies": [Policy("p")], "tasks": tasks,
                 "episodes": [e for e, _ in rows], "turns": [t for _, t in rows]}, stage="test", message="seed")
    goals = dict(lake.query("SELECT task_id, goal FROM episode_goals").rows())
    assert goals["doors/train/3/0"] != goals["doors/test/3/0"]  # the same first room, another key
    assert goals["doors/train/3/0"] == goals["doors/test/3/1"]  # the same task content
    assert '"key": "pink"' in goals["doors/test/3/1"]
