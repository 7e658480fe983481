"""What the viewer's train run, eval comparison and trained-on pages show, read from the lake at one snapshot.

Every read takes a list of train run ids: a served page passes its one run (each query then filters by it), the
static export passes every train run of the lake (one query each, for all its pages). The rows come back in
one order and are split by run in Python, so a train run's page gets the same data either way and renders to
the same bytes (train_pages's renderers).

A train run's policies are its checkpoints (`policies.run_id` = the run, with a step), the policy it started
from (their parent outside the run, or the run's `start_policy`) and that one's ancestors (`parent_policy_id`,
a cycle stopped). Its evals are the eval runs whose episodes' policy is one of those, or whose parent run it
is (the in-training evals `trajlake train --eval-every` writes, `RUN/eval-STEP`), grouped by env and split: a
group is shown when it holds an eval of the run's own (an ancestor's alone says nothing of this run), with the
start's and the ancestors' evals on the same tasks as its baselines. Env errors are left out, as everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trajlake.store.reads import eval_contamination

#: the lake's train runs: of kind `train`, or with recorded steps
TRAIN_IDS_SQL = """
SELECT run_id FROM runs WHERE kind = 'train'
UNION SELECT DISTINCT run_id FROM train_steps ORDER BY run_id
"""
#: the train runs $1 and the runs under them (`parent_run_id`: their iterations' collect runs, in-training evals)
TRAIN_RUNS_SQL = """
SELECT r.run_id, r.kind, r.status, r.config::VARCHAR AS config, r.started_at, r.finished_at, r.code_version,
       r.parent_run_id
FROM runs r
WHERE r.run_id IN (SELECT unnest($1::VARCHAR[])) OR r.parent_run_id IN (SELECT unnest($1::VARCHAR[]))
ORDER BY r.started_at, r.run_id
"""
#: the steps of train runs $1, with how many distinct episodes each trained on
TRAIN_STEPS_SQL = """
SELECT run_id, step, policy_id, snapshot_read, spec_id, metrics::VARCHAR AS metrics,
       coalesce(len(list_distinct(episode_ids)), 0) AS listed
FROM train_steps WHERE run_id IN (SELECT unnest($1::VARCHAR[]))
ORDER BY run_id, step
"""
#: where the episodes each step of train runs $1 trained on came from: per step and run, how many (the step
#: $2 alone when given); an episode no longer in the lake is not counted
TRAINED_FROM_SQL = """
SELECT s.run_id, s.step, e.run_id AS from_run, count(DISTINCT s.episode_id) AS episodes
FROM (SELECT run_id, step, unnest(episode_ids) AS episode_id FROM train_steps
      WHERE run_id IN (SELECT unnest($1::VARCHAR[])) AND ($2::BIGINT IS NULL OR step = $2)) s
JOIN episodes e ON e.episode_id = s.episode_id
GROUP BY ALL ORDER BY s.run_id, s.step, from_run NULLS LAST
"""
#: every policy (a small table: one row per checkpoint), for the lineage
POLICIES_SQL = """
SELECT policy_id, run_id, step, parent_policy_id, checkpoint_uri, base_model, created_at
FROM policies ORDER BY created_at, policy_id
"""
#: per eval run, policy, env, split and task: the played episodes, the successes and the first episode, of
#: the eval runs `{which}` selects (EVALS_OF or EVAL_RUNS)
EVAL_TASKS_SQL = """
SELECT e.run_id AS eval_run, r.parent_run_id, r.started_at, e.policy_id, e.env, t.split, e.task_id,
       count(*) AS episodes, count(*) FILTER (WHERE e.success) AS successes, min(e.episode_id) AS episode_id
FROM episodes e JOIN runs r USING (run_id) LEFT JOIN tasks t USING (task_id)
WHERE r.kind = 'eval' AND e.status IS DISTINCT FROM 'error' AND {which}
GROUP BY ALL
ORDER BY r.started_at, e.run_id, e.policy_id NULLS LAST, e.env NULLS LAST, t.split NULLS LAST, e.task_id NULLS LAST
"""
#: the eval runs whose episodes' policy is one of $1 or whose parent run is one of $2
EVALS_OF = "(e.policy_id IN (SELECT unnest($1::VARCHAR[])) OR r.parent_run_id IN (SELECT unnest($2::VARCHAR[])))"
#: the eval runs $1
EVAL_RUNS = "e.run_id IN (SELECT unnest($1::VARCHAR[]))"
#: the steps' main metric for the run list's sparklines, the first of these a run has
SPARK_METRICS = (("success_mean", "success"), ("reward_mean", "reward"), ("loss", "loss"))


def number(v: Any) -> float | None:
    """A metric value as a float, None where it is not a number (text, a bool, null)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def metric(step: dict, key: str) -> float | None:
    """Step `step`'s metric `key` as a number (None where it lacks one): how the viewer and the report read a run's
    curves. `response_length` is derived: agent tokens per episode."""
    m = step["metrics"]
    if key == "response_length":
        tokens, eps = number(m.get("agent_tokens")), number(m.get("episodes"))
        return tokens / eps if tokens is not None and eps else None
    return number(m.get(key))


#: every train step's metrics, for the run list's sparklines
SPARK_SQL = "SELECT run_id, step, metrics::VARCHAR AS metrics FROM train_steps ORDER BY run_id, step"
#: the longest lineage walked up from a run's start (a hand-edited cycle stops here, as the lineage views do)
MAX_DEPTH = 64
#: an in-training eval's run id (`trajlake train`'s: `RUN/eval-STEP`)
_EVAL_STEP = re.compile(r"/eval-(\d+)$")


@dataclass(frozen=True)
class PolicyEval:
    """One eval run's episodes of one policy, env and split: per task (episodes, successes, first episode id),
    what the policy is to the train run the page is of (`role`: own, start, ancestor or eval, its step `x` on
    the run's curve when it has one) and its `eval_contamination` row (`held_out`)."""

    eval_run: str
    parent_run_id: str | None
    started_at: Any
    policy_id: str | None
    env: str | None
    split: str | None
    tasks: dict[str, tuple[int, int, str]]
    role: str = ""
    x: float | None = None
    depth: int = 0
    held_out: dict | None = None

    @property
    def episodes(self) -> int:
        return sum(n for n, _, _ in self.tasks.values())

    @property
    def successes(self) -> int:
        return sum(s for _, s, _ in self.tasks.values())

    @property
    def key(self) -> tuple:
        return (self.eval_run, self.policy_id, self.env, self.split)


@dataclass(frozen=True)
class EvalGroup:
    """The evals of one env and split, in the order they compare: ancestors (farthest first), the start, the
    run's own by step, then by start time."""

    env: str | None
    split: str | None
    evals: list[PolicyEval]


@dataclass
class TrainView:
    """Everything a train run's pages show (TRAIN_RUNS_SQL's row as `run`, its config parsed)."""

    run_id: str
    run: dict | None
    children: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    sources: dict[int, list[tuple[str | None, int]]] = field(default_factory=dict)
    policies: list[dict] = field(default_factory=list)
    groups: list[EvalGroup] = field(default_factory=list)


def _json(text: Any) -> dict:
    """A JSON column read as text: its object, {} for none or for text that is not one."""
    if isinstance(text, dict):
        return text
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def lineage(policies: dict[str, dict], run_id: str, start: str | None) -> dict[str, tuple[str, float | None, int]]:
    """policy id -> (role, step on the run's curve, depth) for train run `run_id`: its checkpoints (`own`, at
    their step), the policies it started from (`start`, at 0: their parent outside the run, and `start`, the
    run's recorded start policy) and their ancestors (`ancestor`, depth 2 and up, no step)."""
    roles: dict[str, tuple[str, float | None, int]] = {}
    own = {pid: p for pid, p in policies.items() if p["run_id"] == run_id and p["step"] is not None}
    for pid, p in sorted(own.items(), key=lambda kv: kv[1]["step"]):
        roles[pid] = ("own", float(p["step"]), 0)
    starts = sorted({p["parent_policy_id"] for p in own.values() if p["parent_policy_id"]} - own.keys())
    if start and start not in own and start not in starts:
        starts.append(start)
    frontier = []
    for pid in starts:
        roles.setdefault(pid, ("start", 0.0, 1))
        frontier.append(pid)
    depth = 1
    while frontier and depth < MAX_DEPTH:
        depth += 1
        nxt = []
        for pid in frontier:
            parent = (policies.get(pid) or {}).get("parent_policy_id")
            if parent and parent not in roles:
                roles[parent] = ("ancestor", None, depth)
                nxt.append(parent)
        frontier = nxt
    return roles


def _order(e: PolicyEval) -> tuple:
    rank = {"ancestor": 0, "start": 1, "own": 2, "eval": 2}.get(e.role, 3)
    return (rank, -e.depth if e.role == "ancestor" else 0, e.x if e.x is not None else float("inf"),
            str(e.started_at), e.eval_run, e.policy_id or "")


def _evals_of(results: list[PolicyEval], run_id: str, roles: dict) -> list[EvalGroup]:
    """The eval groups train run `run_id` shows (module docstring), each in compare order."""
    mine = []
    for r in results:
        if r.policy_id in roles:
            role, x, depth = roles[r.policy_id]
        elif r.parent_run_id == run_id:
            m = _EVAL_STEP.search(r.eval_run)
            role, x, depth = "eval", (float(m.group(1)) if m else None), 0
        else:
            continue
        mine.append(dataclasses.replace(r, role=role, x=x, depth=depth))
    groups: dict[tuple, list[PolicyEval]] = {}
    for r in mine:
        groups.setdefault((r.env, r.split), []).append(r)
    out = []
    for (env, split), evals in groups.items():
        if any(e.role in ("own", "eval") or e.parent_run_id == run_id for e in evals):
            out.append(EvalGroup(env, split, sorted(evals, key=_order)))
    return sorted(out, key=lambda g: (g.env or "", g.split or ""))


def eval_results(lake, snapshot: int, rows: list[dict]) -> list[PolicyEval]:
    """One PolicyEval per (eval run, policy, env, split) of EVAL_TASKS_SQL's `rows`, in their order, each with its
    `eval_contamination` row."""
    by: dict[tuple, dict] = {}
    for r in rows:
        key = (r["eval_run"], r["policy_id"], r["env"], r["split"])
        if key not in by:
            by[key] = {k: r[k] for k in ("eval_run", "parent_run_id", "started_at", "policy_id", "env", "split")}
            by[key]["tasks"] = {}
        by[key]["tasks"][r["task_id"]] = (int(r["episodes"]), int(r["successes"]), r["episode_id"])
    held = {}
    if by:
        for h in _held_out(lake, snapshot, tuple(sorted({k[0] for k in by}))):
            held[(h["eval_run"], h["policy_id"], h["env"], h["split"])] = h
    return [PolicyEval(**v, held_out=held.get(k)) for k, v in by.items()]


@lru_cache(maxsize=64)
def _held_out(lake, snapshot: int, runs: tuple[str, ...]) -> tuple[dict, ...]:
    """`eval_contamination`'s rows of eval runs `runs` at `snapshot`, kept: the view reads every episode's first
    turn (most of a train page's time), and at a pinned snapshot its answer cannot change."""
    return tuple(eval_contamination(lake, list(runs), snapshot=snapshot).to_dicts())


def train_ids(lake, snapshot: int) -> list[str]:
    return lake.query(TRAIN_IDS_SQL, snapshot=snapshot)["run_id"].to_list()


def read_steps(lake, snapshot: int, run_ids: list[str]) -> dict[str, list[dict]]:
    """The steps of train runs `run_ids` (TRAIN_STEPS_SQL's rows, `metrics` parsed), by run id, in step order;
    a run without steps is absent."""
    out: dict[str, list[dict]] = {}
    for s in lake.query(TRAIN_STEPS_SQL, [sorted(set(run_ids))], snapshot=snapshot).to_dicts():
        s["metrics"] = _json(s["metrics"])
        out.setdefault(s["run_id"], []).append(s)
    return out


def steps_query(run_ids: list[str]) -> str:
    """TRAIN_STEPS_SQL with `run_ids` written in, as `trajlake sql` reruns it."""
    ids = ", ".join("'" + r.replace("'", "''") + "'" for r in sorted(set(run_ids))) or "NULL"
    return TRAIN_STEPS_SQL.strip().replace("(SELECT unnest($1::VARCHAR[]))", f"({ids})")


def curve_table(steps: dict[str, list[dict]], columns: dict[str, str]) -> list[dict]:
    """One row per step of `steps` (read_steps'): run_id, step and each metric of `columns` (key -> column name)
    as `metric` reads it."""
    return [{"run_id": rid, "step": s["step"], **{col: metric(s, key) for key, col in columns.items()}}
            for rid, rows in steps.items() for s in rows]


def read_train(lake, snapshot: int, run_ids: list[str]) -> dict[str, TrainView]:
    """The TrainView of each of `run_ids` that is a train run (of kind train, or with steps), in a few queries
    over all of them."""
    ids = sorted(set(run_ids))
    q = lambda sql, params=None: lake.query(sql, params, snapshot=snapshot)  # noqa: E731
    runs = q(TRAIN_RUNS_SQL, [ids]).to_dicts()
    steps = read_steps(lake, snapshot, ids)
    own_runs = {r["run_id"]: r for r in runs if r["run_id"] in ids}
    views = {rid: TrainView(rid, own_runs.get(rid), steps=steps.get(rid, [])) for rid in ids
             if rid in steps or (own_runs.get(rid) or {}).get("kind") == "train"}
    if not views:
        return {}
    for r in runs:
        r["config"] = _json(r["config"])
        if r["parent_run_id"] in views and r["run_id"] != r["parent_run_id"]:
            views[r["parent_run_id"]].children.append(r)
    for r in q(TRAINED_FROM_SQL, [list(views), None]).to_dicts():
        views[r["run_id"]].sources.setdefault(r["step"], []).append((r["from_run"], int(r["episodes"])))
    policies = {p["policy_id"]: p for p in q(POLICIES_SQL).to_dicts()}
    roles = {rid: lineage(policies, rid, (v.run["config"] if v.run else {}).get("start_policy"))
             for rid, v in views.items()}
    wanted = sorted({pid for r in roles.values() for pid in r})
    results = eval_results(lake, snapshot, q(EVAL_TASKS_SQL.format(which=EVALS_OF), [wanted, list(views)]).to_dicts())
    for rid, v in views.items():
        for pid, (role, _, depth) in roles[rid].items():
            p = policies.get(pid) or {"policy_id": pid, "run_id": None, "step": None, "parent_policy_id": None,
                                      "checkpoint_uri": None, "base_model": None, "created_at": None}
            v.policies.append({**p, "role": role, "depth": depth})
        v.groups = _evals_of(results, rid, roles[rid])
    return views


def eval_pair(lake, snapshot: int, a: str, b: str) -> list[EvalGroup]:
    """Eval runs `a` and `b` compared: one group per env and split either has (each eval its run's role: a or
    b). An id that is no eval run with played episodes: a KeyError naming it."""
    rows = lake.query(EVAL_TASKS_SQL.format(which=EVAL_RUNS), [[a, b]], snapshot=snapshot).to_dicts()
    found = {r["eval_run"] for r in rows}
    for rid in (a, b):
        if rid not in found:
            raise KeyError(rid)
    results = eval_results(lake, snapshot, rows)
    groups: dict[tuple, list[PolicyEval]] = {}
    for side, rid in (("a", a), ("b", b)):
        for r in results:
            if r.eval_run == rid:
                groups.setdefault((r.env, r.split), []).append(dataclasses.replace(r, role=side))
    return [EvalGroup(env, split, evals) for (env, split), evals in sorted(
        groups.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or ""))]


def sparks(lake, snapshot: int) -> dict[str, tuple[str, list[tuple[float, float | None]]]]:
    """run id -> (label, [(step, value)]) of each train run's main metric (the first of SPARK_METRICS it has)."""
    by: dict[str, list[dict]] = {}
    for r in lake.query(SPARK_SQL, snapshot=snapshot).to_dicts():
        r["metrics"] = _json(r["metrics"])
        by.setdefault(r["run_id"], []).append(r)
    out = {}
    for rid, rs in by.items():
        for key, label in SPARK_METRICS:
            points = [(float(r["step"]), metric(r, key)) for r in rs]
            if any(v is not None for _, v in points):
                out[rid] = (label, points)
                break
    return out


__all__ = ["EvalGroup", "PolicyEval", "TrainView", "curve_table", "eval_pair", "eval_results", "lineage", "metric",
           "number", "read_steps", "read_train", "sparks", "steps_query", "train_ids"]
