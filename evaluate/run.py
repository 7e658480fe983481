"""`trajlake evaluate`: play held-out tasks with one or more policies, store the episodes (run kind `eval`),
score them with a reward spec, and summarise per policy, env and difficulty with confidence intervals.

The store is the cache: an eval run's id is a hash of the policy and every setting, so evaluating the same
policy the same way again reads the stored episodes (or finishes a run cut short, and retries the episodes
that ended in an env error) instead of replaying. Episodes that ended in an env error are left out of every
number and counted on their own; a policy whose every episode ended in one fails the evaluation.

Run contract: no one names an eval run, so a run id always comes back with the settings it was made from (the
fields left out of the hash, env_url and the reporting ones, change no episode); collect's RUN_FIELDS check
holds it to them all the same. Every policy, the env, the template and the tokenizer are checked before the
first episode is played, so an evaluation refused for its second policy stores nothing for its first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from trajlake.collect.config import rollout_fields
from trajlake.core.config_types import id_settings
from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_list
from trajlake.evaluate.config import EvalConfig
from trajlake.evaluate.contamination import contamination_notes, with_contamination
from trajlake.evaluate.metrics import summarize
from trajlake.store import Lake
from trajlake.store.runs import hashed_run_id


@dataclass
class EvalResult:
    """The eval run of each policy and the summary table (one row per policy, env and difficulty)."""

    runs: dict[str, str]
    summary: pl.DataFrame
    spec_id: str
    errors: int = 0
    notes: list[str] = field(default_factory=list)


def eval_run_id(config: EvalConfig, policy: str) -> str:
    """`eval-<env>-<split>-<hash>`: the same policy evaluated the same way gets the same run (and its
    stored episodes) back. The hash holds `policy` and the settings that identify a run (core.config_types:
    not the `operational` ones, which change no episode; the `added_later` ones only away from the value the
    older ids were made at); `policies` is left out, as each policy has a run of its own."""
    return hashed_run_id(f"eval-{config.env}-{config.split}-", [policy, id_settings(config, ("policies",))], 12)


EPISODES_SQL = """
SELECT e.episode_id, e.run_id, e.policy_id, e.env, e.task_id, e.sample_index, e.status, e.success, r.total AS reward,
       e.num_turns, e.num_agent_tokens AS agent_tokens,
       coalesce(CAST(TRY_CAST(json_extract(t.meta, '$.difficulty') AS INTEGER) AS VARCHAR), '-') AS difficulty,
       coalesce(f.format_errors, 0) AS format_errors, coalesce(f.turns_played, 0) AS turns_played
FROM episodes e
LEFT JOIN tasks t USING (task_id)
LEFT JOIN (SELECT * FROM episode_rewards WHERE spec_id = ?) r USING (episode_id)
LEFT JOIN (SELECT episode_id, count(*) FILTER (WHERE NOT format_ok) AS format_errors, count(*) AS turns_played
           FROM turns GROUP BY episode_id) f USING (episode_id)
WHERE e.run_id IN (SELECT unnest(?::VARCHAR[]))
"""


def eval_collect_config(config: EvalConfig, policy: str, run_id: str, *, parent_run_id: str | None = None):
    """The collect run that plays `policy` for this evaluation (checks the env, template and tokenizer); a train
    run's held-out evals are made here too, as runs of the train run (`parent_run_id`)."""
    from trajlake.collect.config import CollectConfig

    return CollectConfig(**rollout_fields(config, temperature=0.0 if config.greedy else config.temperature),
                         policy=policy, tasks=config.tasks, samples=config.samples, run_id=run_id,
                         tokenizer=config.tokenizer, seed=config.seed, progress=config.progress, run_kind="eval",
                         parent_run_id=parent_run_id)


def success_rate(lake: Lake, run_id: str) -> dict[str, float]:
    """`eval_success` and `eval_env_reward` of an eval run: the means over its `eval_episodes` episodes that did
    not end in an env error (those say nothing of the policy)."""
    row = lake.query("SELECT avg(success::INT) AS s, avg(env_reward) AS e, count(*) AS n FROM episodes "
                     "WHERE run_id = ? AND status IS DISTINCT FROM 'error'", [run_id]).to_dicts()[0]
    return {"eval_success": float(row["s"] or 0.0), "eval_env_reward": float(row["e"] or 0.0),
            "eval_episodes": int(row["n"])}


def _play(cc, lake: Lake) -> None:
    from trajlake.collect.rollout import EnvErrorsOnly, collect

    try:
        collect(cc, lake)
    except EnvErrorsOnly as e:  # the same evaluate again resumes this run (its id is a hash of the settings)
        raise TrajlakeError(f"evaluate: eval run {cc.run_id} of {cc.policy} failed: {e.what}; run the same evaluate "
                            "again once the env works") from None


def evaluate(config: EvalConfig, lake: Lake) -> EvalResult:
    """Play (or reuse) an eval run per policy, score it, and summarise it."""
    from trajlake.collect.policies import check_policy_spec, resolve_policy_spec
    from trajlake.collect.rollout import stored_run
    from trajlake.rewards import default_spec, load_spec
    from trajlake.rewards.score import score

    spec = load_spec(config.spec) if config.spec else default_spec()
    runs: dict[str, str] = {}
    plays = []
    for p in config.policies:  # every check before the first episode: a bad later policy must leave no trace
        resolved = resolve_policy_spec(lake, p)
        runs[p] = eval_run_id(config, resolved)
        cc = eval_collect_config(config, resolved, runs[p])
        check_policy_spec(resolved, env=cc.env, lake=lake, tokenizer_path=config.tokenizer)
        stored_run(lake, cc)  # a stored run of this id played otherwise is refused (collect's RUN_FIELDS)
        plays.append(cc)
    for cc in plays:
        _play(cc, lake)
    ids = list(runs.values())
    where = "run_id IN (" + sql_list(ids) + ")"
    score(lake, spec, where=where, run_id=ids[0])
    eps = lake.query(EPISODES_SQL, [spec.spec_id, ids])
    failed = pl.col("status").eq_missing("error")
    pair = ["run_id", "task_id", "sample_index"]
    # errored attempts whose (task, sample) was played since (by a resumed run) are history: left out silently
    errors = eps.filter(failed).select(pair).unique().join(eps.filter(~failed).select(pair), on=pair,
                                                           how="anti").height
    eps = eps.filter(~failed).drop("sample_index")
    if eps.height == 0:
        raise TrajlakeError(f"evaluate: no episode finished without an env error in runs {', '.join(ids)}")
    names = {v: k for k, v in runs.items()}
    rank = {rid: i for i, rid in enumerate(ids)}  # rows in the order the policies were given
    eps = eps.with_columns(pl.col("run_id").replace_strict(names).alias("policy"),
                           pl.col("run_id").replace_strict(rank).alias("_rank")).sort("_rank", "difficulty", "task_id",
                                                                                     "episode_id")
    overall = summarize(eps.with_columns(pl.lit("all").alias("difficulty")), ["policy", "env", "difficulty"],
                        config.pass_ks, config.confidence)
    per_level = summarize(eps, ["policy", "env", "difficulty"], config.pass_ks, config.confidence)
    levels = per_level["difficulty"].n_unique() if per_level.height else 0
    table = pl.concat([overall, per_level], how="diagonal_relaxed") if levels > 1 else overall
    table = with_contamination(lake, table, runs, config.confidence)
    notes = contamination_notes(table)
    if errors:
        notes.append(f"{errors} episode(s) ended with an env error and are left out: run the same evaluate again "
                     "to retry them")
    return EvalResult(runs=runs, summary=table, spec_id=spec.spec_id, errors=errors, notes=notes)


__all__ = ["EvalConfig", "EvalResult", "evaluate", "eval_run_id"]
