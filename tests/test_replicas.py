"""Policy replicas on Ray (collect/policies/replicas.py, `collect --replicas N`): 2 replicas of the tiny model
on this CPU write into a PostgreSQL-catalog lake what one replica writes for greedy decoding; a replica killed
mid-run loses and duplicates no episode (its requests go to the replica left); text policies are refused.
The tests that start replicas are in the slow tier (make test-slow, which CI runs)."""

from __future__ import annotations

import pytest

from tests.conftest import make_uri
from tests.helpers import tiny_model_dir
from trajlake.collect.config import CollectConfig
from trajlake.collect.policies.replicas import ReplicatedPolicy
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake

ray = pytest.importorskip("ray")

ROLLOUT = dict(env="doors", difficulty=3, max_turns=4, template="action", max_new_tokens=10, temperature=0.0,
               tasks=6, samples=1, concurrency=6, progress=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    yield
    ray.shutdown()


def episodes(lake: Lake, run_id: str) -> list[tuple]:
    """(task, sample, turn, prompt ids, reply ids) of every turn of a run, in order."""
    rows = lake.query("SELECT e.task_id, e.sample_index, t.turn, t.prompt_token_ids, t.response_token_ids "
                      "FROM turns t JOIN episodes e USING (episode_id) WHERE e.run_id = ? ORDER BY 1, 2, 3",
                      [run_id])
    return [tuple(map(lambda v: tuple(v) if isinstance(v, list) else v, r)) for r in rows.iter_rows()]


@pytest.fixture
def pg_lake_uri(request, tmp_path):
    """A PostgreSQL-catalog lake (skipped, saying why, where no server answers)."""
    return make_uri("postgres", tmp_path, request)


@pytest.mark.slow  # Ray actors loading the model: 20-40 s each on 2 cores
def test_two_replicas_write_what_one_writes(model, pg_lake_uri):
    with Lake.open(pg_lake_uri) as lake:
        collect(CollectConfig(policy=f"hf:{model}", run_id="one", **ROLLOUT), lake)
        collect(CollectConfig(policy=f"hf:{model}", run_id="two", replicas=2, **ROLLOUT), lake)
        one, two = episodes(lake, "one"), episodes(lake, "two")
        assert len(one) > 6 and [r[:3] for r in one] == [r[:3] for r in two]
        assert [r[3:] for r in one] == [r[3:] for r in two], "greedy replies differ between 1 and 2 replicas"
        policies = lake.query("SELECT DISTINCT policy_id FROM episodes WHERE run_id = 'two'")["policy_id"]
        assert policies.to_list() == [f"hf:{model}"]


@pytest.mark.slow  # Ray actors loading the model: 20-40 s each on 2 cores
def test_a_replica_killed_mid_run_loses_and_duplicates_nothing(model, tmp_path):
    policy = ReplicatedPolicy(f"hf:{model}", 2)
    pids = ray.get([a.pid.remote() for a in policy.actors])
    assert len(set(pids)) == 2, "two actors, two processes"
    calls = {"n": 0}
    generate = policy.generate

    def kill_on_second_turn(requests, params):
        calls["n"] += 1
        if calls["n"] == 2:
            ray.kill(policy.actors[0])  # a real kill of a real actor, between two turns
        return generate(requests, params)

    policy.generate = kill_on_second_turn
    with Lake.open(str(tmp_path / "lake")) as lake:
        collect(CollectConfig(policy=f"hf:{model}", run_id="killed", **ROLLOUT), lake, policy=policy)
        collect(CollectConfig(policy=f"hf:{model}", run_id="whole", **ROLLOUT), lake)
        assert policy.alive == [1] and policy.retried > 0
        n = lake.query("SELECT count(*) AS n, count(DISTINCT (task_id, sample_index)) AS pairs FROM episodes "
                       "WHERE run_id = 'killed'").row(0, named=True)
        assert n == {"n": 6, "pairs": 6}, "one episode per (task, sample): none lost, none twice"
        assert episodes(lake, "killed") == episodes(lake, "whole")
    policy.close()


@pytest.mark.slow  # Ray actors loading the model: 20-40 s each on 2 cores
def test_every_replica_dead_fails_the_run_with_one_line(model, tmp_path):
    policy = ReplicatedPolicy(f"hf:{model}", 1)
    ray.kill(policy.actors[0])
    with Lake.open(str(tmp_path / "lake")) as lake:
        with pytest.raises(TrajlakeError, match="every policy replica of .* died"):
            collect(CollectConfig(policy=f"hf:{model}", run_id="dead", **ROLLOUT), lake, policy=policy)
        assert lake.query("SELECT status FROM runs WHERE run_id = 'dead'").item() == "failed"


@pytest.mark.parametrize("spec, message", [
    ("scripted:doors", "replicas copy a model policy"),
    ("openai:http://127.0.0.1:9#m", "replicas copy a model policy"),
])
def test_text_policies_are_refused(spec, message, tmp_path, model):
    with Lake.open(str(tmp_path / "lake")) as lake:
        with pytest.raises(TrajlakeError, match=message):
            collect(CollectConfig(policy=spec, tokenizer=str(model), run_id="x", replicas=2, **ROLLOUT), lake)
        assert lake.query("SELECT count(*) FROM runs").item() == 0


@pytest.mark.slow  # Ray actors loading the model
def test_train_rollouts_on_replicas_load_each_new_checkpoint(model, tmp_path):
    """GRPO with replicas 2: the replicas start once and load every new checkpoint; each iteration's rollouts
    are recorded as played by that iteration's policy, and the weights changed."""
    from tests.helpers import small_cfg, varied_spec
    from trajlake.train.loop import train

    cfg = small_cfg(model, run_id="rep", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=2,
                    replicas=2, reward_spec=varied_spec(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"))
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = train(cfg, lake)
        assert res.step == 2
        played = lake.query("SELECT run_id, policy_id, count(*) AS n FROM episodes GROUP BY ALL ORDER BY 1").rows()
        assert played == [("rep/it-1", f"hf:{model}", 4), ("rep/it-2", "rep/step-1", 4)]
        # the replicas sampled iteration 2 with step 1's weights: its stored log-probs are step 1's
        row = lake.query("SELECT t.prompt_token_ids AS p, t.response_token_ids AS r, t.response_logprobs AS lp "
                         "FROM turns t JOIN episodes e USING (episode_id) WHERE e.run_id = 'rep/it-2' "
                         "ORDER BY e.episode_id LIMIT 1").row(0, named=True)
        ckpt = lake.query("SELECT checkpoint_uri FROM policies WHERE policy_id = 'rep/step-1'").item()
    import torch

    from trajlake.lm.load import load_model

    def logprobs(path):
        ids = torch.tensor([list(row["p"]) + list(row["r"])])
        with torch.no_grad():
            logp = torch.log_softmax(load_model(path)(ids).logits[0].float(), -1)
        n = len(row["p"])
        return [logp[n + i - 1, t].item() for i, t in enumerate(row["r"])]

    assert row["lp"] == pytest.approx(logprobs(ckpt), abs=1e-4)
    assert row["lp"] != pytest.approx(logprobs(model), abs=1e-4), "the replicas still held the start weights"
