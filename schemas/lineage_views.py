"""Views that say whether a held-out number is held out: which episodes trained each policy, each episode's goal,
and, per evaluation, how many of its tasks share a goal with what the evaluated policy trained on.

policy_training_episodes(policy_id, train_run, episode_id): every episode a train step on the policy's way trained
on (`train_steps.episode_ids`): its own run's steps up to the policy's step and, through `parent_policy_id`, its
ancestors' runs up to theirs (the SFT warm start of a GRPO run, the imported or collected demonstrations of that
SFT). A base model or a scripted policy trained on nothing has no rows.

episode_goals(episode_id, env, task_id, family, goal): an episode's goal: the env family (the env name without
`agentgym/`, so an imported `textcraft` episode meets a played `agentgym/textcraft` one) and the goal text,
lower-cased and single-spaced. Where GOAL_RULES knows the env, the goal is read off the first observation (turn 0)
with the env's own variable parts left out: TextCraft's first observation lists its crafting commands shuffled,
with random distractors, so only its `Goal: craft X` is the goal; BabyAI's room description changes with the
seed, its `Your goal: ...` does not. Another env's goal is its whole task where the store holds it (the tasks
row's instruction and ground truth: a made task such as doors' shows only its first room in its first
observation, so two different tasks can open alike), else its whole first observation.

eval_contamination(eval_run, policy_id, env, split, tasks, contaminated_tasks, episodes, successes, success_rate,
clean_tasks, clean_episodes, clean_successes, clean_success_rate): per evaluation (a run of kind `eval`), the
tasks that share a task id or a goal with any episode in the evaluated policy's lineage, and the success on the
rest. Env errors are left out, as everywhere.
"""

from __future__ import annotations

#: (env family, RE2 pattern whose first group is the goal): the goal part of a first observation where the rest
#: varies between episodes of the same goal. Kept in SQL so a user's query reads the same rules.
GOAL_RULES: tuple[tuple[str, str], ...] = (
    ("textcraft", r"Goal: *(craft [^.\n]+)"),
    ("babyai", r"[Yy]our goal: *([^\n]+)"),
)

_RULES_VALUES = ", ".join(f"('{family}', '{pattern}')" for family, pattern in GOAL_RULES)

def training_episodes_sql(policies: str) -> str:
    """policy_training_episodes' query for the policies the query `policies` gives (a `policy_id` column): every
    episode a train step on each one's way trained on. The view reads every policy's; eval_contamination only the
    evaluated ones', since the rows grow with steps x episodes over all policies (a run's 100 checkpoints on 1M
    episodes: 50M rows and 5.4 GB to find one evaluated policy's 1M, bench/scale.py)."""
    return f"""
WITH RECURSIVE chain(policy_id, ancestor_id, depth) AS (  -- each policy and its ancestors (a cycle stops at 64)
    SELECT policy_id, policy_id, 0 FROM ({policies})
    UNION ALL
    SELECT c.policy_id, p.parent_policy_id, c.depth + 1
    FROM chain c JOIN policies p ON p.policy_id = c.ancestor_id
    WHERE p.parent_policy_id IS NOT NULL AND c.depth < 64
), reach AS (  -- the train runs on each policy's way, and the last of their steps it went through
    SELECT c.policy_id, a.run_id, max(a.step) AS upto
    FROM chain c JOIN policies a ON a.policy_id = c.ancestor_id
    WHERE a.step IS NOT NULL AND a.run_id IS NOT NULL
    GROUP BY c.policy_id, a.run_id
), used AS (
    SELECT r.policy_id, s.run_id AS train_run, unnest(s.episode_ids) AS episode_id
    FROM reach r JOIN train_steps s ON s.run_id = r.run_id AND s.step <= r.upto
)
SELECT DISTINCT policy_id, train_run, episode_id FROM used
"""


POLICY_TRAINING_EPISODES_SQL = training_episodes_sql("SELECT policy_id FROM policies")

EPISODE_GOALS_SQL = f"""
WITH rules(family, pattern) AS (VALUES {_RULES_VALUES}),
stored_tasks AS (  -- each task's whole content, where the store holds its ground truth
    SELECT task_id, any_value(coalesce(instruction, '') || ' ' || ground_truth::VARCHAR) AS content
    FROM tasks WHERE ground_truth IS NOT NULL GROUP BY task_id
),
firsts AS (
    SELECT e.episode_id, e.env, e.task_id, regexp_replace(e.env, '^agentgym/', '') AS family, t.observation
    FROM episodes e JOIN turns t ON t.episode_id = e.episode_id AND t.turn = 0
)
SELECT f.episode_id, f.env, f.task_id, f.family,
       lower(regexp_replace(trim(coalesce(nullif(regexp_extract(f.observation, r.pattern, 1), ''),
                                          CASE WHEN r.pattern IS NULL THEN k.content END, f.observation)),
                            '\\s+', ' ', 'g')) AS goal
FROM firsts f LEFT JOIN rules r USING (family) LEFT JOIN stored_tasks k USING (task_id)
"""

#: the lineage of the policies the `ev` CTE below evaluates, indented as a CTE's body
_EVALUATED_LINEAGE = training_episodes_sql("SELECT DISTINCT policy_id FROM ev").strip().replace("\n", "\n    ")

EVAL_CONTAMINATION_SQL = f"""
WITH ev AS (  -- the evaluated episodes (env errors left out)
    SELECT e.run_id AS eval_run, e.policy_id, e.env, t.split, e.episode_id, e.task_id, coalesce(e.success, false) AS won
    FROM episodes e JOIN runs r USING (run_id) LEFT JOIN tasks t USING (task_id)
    WHERE r.kind = 'eval' AND e.status IS DISTINCT FROM 'error'
), lineage AS (  -- policy_training_episodes of the evaluated policies alone
    {_EVALUATED_LINEAGE}
), trained AS (  -- what each evaluated policy's lineage trained on: task ids and goals
    SELECT DISTINCT p.policy_id, g.task_id, g.family, g.goal
    FROM lineage p JOIN episode_goals g USING (episode_id)
), ev_goals AS (
    SELECT ev.eval_run, ev.policy_id, ev.task_id, g.family, g.goal
    FROM ev JOIN episode_goals g USING (episode_id)
), hits AS (  -- evaluated tasks sharing a task id, or a goal, with a trained-on episode
    SELECT ev_goals.eval_run, ev_goals.task_id
    FROM ev_goals JOIN trained ON trained.policy_id = ev_goals.policy_id AND trained.task_id = ev_goals.task_id
    UNION
    SELECT ev_goals.eval_run, ev_goals.task_id
    FROM ev_goals JOIN trained ON trained.policy_id = ev_goals.policy_id AND trained.family = ev_goals.family
                             AND trained.goal = ev_goals.goal
), marked AS (
    SELECT ev.*, h.task_id IS NOT NULL AS contaminated
    FROM ev LEFT JOIN hits h ON h.eval_run = ev.eval_run AND h.task_id = ev.task_id
)
SELECT eval_run, policy_id, env, split,
       count(DISTINCT task_id) AS tasks,
       count(DISTINCT task_id) FILTER (WHERE contaminated) AS contaminated_tasks,
       count(*) AS episodes,
       count(*) FILTER (WHERE won) AS successes,
       round(avg(won::INT), 3) AS success_rate,
       count(DISTINCT task_id) FILTER (WHERE NOT contaminated) AS clean_tasks,
       count(*) FILTER (WHERE NOT contaminated) AS clean_episodes,
       count(*) FILTER (WHERE NOT contaminated AND won) AS clean_successes,
       round(avg(won::INT) FILTER (WHERE NOT contaminated), 3) AS clean_success_rate
FROM marked
GROUP BY eval_run, policy_id, env, split
"""
