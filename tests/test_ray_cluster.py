"""Collection on Ray past one process: env workers that die mid-run end only their own episodes, which a re-run
retries; a real three-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and two more nodes,
each its own raylet) holds policy replicas and env workers on several nodes, loses one node mid-run, and the run,
resumed, stores every (task, sample) once, as one process plays it; and collectors on two of its nodes fill one
PostgreSQL-catalog lake on object storage (a local S3 server) at the same time, with nothing lost or stored twice
(slow: Ray nodes and actors start in 5-40 s each on 2 cores)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import pg_conninfo
from tests.helpers import tiny_model_dir
from trajlake.collect.config import CollectConfig
from trajlake.collect.envpool import RayEnvPool
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_ray")]

ROLLOUT = dict(env="doors", difficulty=3, max_turns=4, template="action", max_new_tokens=10, temperature=0.0,
               tasks=6, samples=1, concurrency=6)
#: the head's health checks: a node killed here is known dead in about 5 s (Ray's default: about 30 s), and a live
#: node on a loaded machine still has 5 s to answer each check
FAST_FAILURE = {"health_check_period_ms": 1000, "health_check_timeout_ms": 5000, "health_check_failure_threshold": 5}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def stored(lake: Lake, run_id: str, *, errors: bool = False) -> list[tuple]:
    """(task, sample, turn, prompt ids, reply ids) of every turn of the run's episodes that played out (or of
    those that ended in an env error)."""
    rows = lake.query("SELECT e.task_id, e.sample_index, t.turn, t.prompt_token_ids, t.response_token_ids "
                      "FROM turns t JOIN episodes e USING (episode_id) WHERE e.run_id = ? AND "
                      f"(e.status = 'error') = {str(errors).lower()} ORDER BY 1, 2, 3", [run_id])
    return [tuple(tuple(v) if isinstance(v, list) else v for v in r) for r in rows.iter_rows()]


def pairs(lake: Lake, run_id: str) -> dict:
    """How many episodes played out, how many distinct (task, sample) they cover, and how many ended in an env
    error."""
    return lake.query("SELECT count(*) FILTER (WHERE status <> 'error') AS played, count(DISTINCT (task_id, "
                      "sample_index)) FILTER (WHERE status <> 'error') AS pairs, count(*) FILTER (WHERE status = "
                      "'error') AS errors FROM episodes WHERE run_id = ?", [run_id]).row(0, named=True)


def test_an_env_worker_killed_mid_run_ends_only_its_episodes_and_a_rerun_retries_them(model, tmp_path,
                                                                                       monkeypatch):
    config = CollectConfig(policy=f"hf:{model}", progress=False, **ROLLOUT)
    step_many = RayEnvPool.step_many
    seen = {"calls": 0, "nodes": None}

    def kill_on_second_turn(pool, items):
        seen["calls"] += 1
        if seen["calls"] == 2:
            seen["nodes"] = pool.nodes()
            ray.kill(pool.actors[0])  # a real kill of a real actor, between two turns
        return step_many(pool, items)

    with Lake.open(str(tmp_path / "lake")) as lake:
        collect(replace(config, run_id="whole"), lake)
        monkeypatch.setattr(RayEnvPool, "step_many", kill_on_second_turn)
        collect(replace(config, run_id="killed", workers=2), lake)
        assert len(seen["nodes"]) == 2
        first = pairs(lake, "killed")
        assert first["errors"] == 3 and first["played"] == first["pairs"] == 3, "actor 0 held 3 of 6 episodes"
        reason = lake.query("SELECT DISTINCT error FROM episodes WHERE run_id = 'killed' AND status = 'error'")
        assert reason.item().startswith("env worker 0 lost (")
        monkeypatch.undo()
        collect(replace(config, run_id="killed", workers=2), lake)  # the same command again: retries the 3
        assert pairs(lake, "killed") == {"played": 6, "pairs": 6, "errors": 3}, "none lost, none twice"
        assert stored(lake, "killed") == stored(lake, "whole")


def test_with_every_env_worker_dead_a_new_episode_is_refused_in_one_line():
    pool = RayEnvPool(lambda: None, 2)
    for a in pool.actors:
        ray.kill(a)
    lost = pool.reset([(0, "task")])
    assert lost[0].done and lost[0].error.startswith("env worker 0 lost (")
    assert pool.alive == [1]
    assert pool.reset([(1, "task")])[0].error.startswith("env worker 1 lost (") and pool.alive == []
    with pytest.raises(TrajlakeError, match=r"every env worker \(2\) died; re-run the same command"):
        pool.reset([(2, "task")])


def test_a_three_node_cluster_loses_a_node_mid_run_and_the_resumed_run_loses_and_duplicates_nothing(
        model, tmp_path, monkeypatch, capfd):
    from ray.cluster_utils import Cluster

    from trajlake.collect.policies.replicas import ReplicatedPolicy

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_FAILURE})
    try:
        others = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # as `ray start --address` gives each collector
        policy = ReplicatedPolicy(f"hf:{model}", 3)
        homes = policy.nodes()
        assert len(set(homes)) == 3, "SPREAD: one replica on each node"
        victim = next(n for n in others if n.node_id in homes)
        generate = policy.generate
        calls = {"n": 0}

        def lose_a_node_on_second_turn(requests, params):
            calls["n"] += 1
            if calls["n"] == 2:
                cluster.remove_node(victim, allow_graceful=False)  # its raylet and every worker on it, killed
                dead_by = time.monotonic() + 60  # and known dead to the cluster before the turn goes on
                while any(n["Alive"] for n in ray.nodes() if n["NodeID"] == victim.node_id):
                    assert time.monotonic() < dead_by, "the killed node was never marked dead"
                    time.sleep(0.2)
            return generate(requests, params)

        policy.generate = lose_a_node_on_second_turn
        config = CollectConfig(policy=f"hf:{model}", progress=True, **ROLLOUT)
        with Lake.open(str(tmp_path / "lake")) as lake:
            collect(replace(config, run_id="cluster", replicas=3, workers=3), lake, policy=policy)
            assert "on Ray: 3 policy replicas on 3 nodes, 3 env workers on 3 nodes" in capfd.readouterr().err
            assert len(policy.alive) == 2 and policy.retried > 0, "the lost node's replica answered elsewhere"
            lost = pairs(lake, "cluster")
            assert lost["errors"] == 2 and lost["played"] == lost["pairs"] == 4, "its env worker held 2 of 6"
            collect(replace(config, run_id="cluster", replicas=3, workers=3), lake, policy=policy)  # resumed
            assert pairs(lake, "cluster") == {"played": 6, "pairs": 6, "errors": 2}, "none lost, none twice"
            policy.close()
            monkeypatch.delenv("RAY_ADDRESS")
            ray.shutdown()
            collect(replace(config, run_id="one", progress=False), lake)  # one process, no Ray
            assert stored(lake, "cluster") == stored(lake, "one")
    finally:
        ray.shutdown()
        cluster.shutdown()


def _collector(uri: str, config: CollectConfig) -> dict:
    """A collect command on a Ray node (as `trajlake --lake URI collect ...` run there): where it ran and
    when."""
    start = time.time()
    with Lake.open(uri) as lake:
        collect(config, lake)
    return {"node": ray.get_runtime_context().get_node_id(), "start": start, "end": time.time()}


def test_collectors_on_two_nodes_fill_one_postgres_lake_on_object_storage_at_once(model, s3, pg_schema):
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    bucket = s3.bucket()
    uri = f"postgres:{pg_conninfo()} metadata_schema={pg_schema} data_path=s3://{bucket}/lake/"
    env = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
                                      "AWS_ENDPOINT_URL")}
    # many small commits from each: every 4 turns a chunk, so the two collectors' commits interleave
    config = CollectConfig(env="maze", policy="scripted:maze", tokenizer=str(model), tasks=6, samples=2,
                           max_turns=12, concurrency=4, chunk_turns=4, progress=False)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        # the job's workers get the object store's credentials as a collector's machine would have them, and
        # this test's folder to import _collector from
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
        runs = [ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))(
            _collector).remote(uri, replace(config, run_id=f"shard-{i}", task_offset=6 * i))
            for i, node in enumerate(nodes)]
        done = ray.get(runs, timeout=300)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert {d["node"] for d in done} == {n.node_id for n in nodes}, "one collector on each of two nodes"
    assert done[0]["start"] < done[1]["end"] and done[1]["start"] < done[0]["end"], "the two ran at once"
    with Lake.open(uri) as lake:
        got = lake.query("SELECT count(*) AS episodes, count(DISTINCT episode_id) AS ids, count(DISTINCT (task_id, "
                         "sample_index)) AS pairs, count(DISTINCT run_id) AS runs, sum(num_turns) AS turns "
                         "FROM episodes").row(0, named=True)
        assert got["episodes"] == got["ids"] == got["pairs"] == 24 and got["runs"] == 2, "none lost, none twice"
        assert lake.query("SELECT count(*) FROM turns").item() == got["turns"]
        chunks = lake.snapshots(changes=False).filter(pl.col("message").str.starts_with("collect: "))
    assert chunks.group_by("run_id").len()["len"].min() >= 2, "each collector committed in several chunks"
    assert any(k.endswith(".parquet") for k in s3.keys(bucket, "lake/")), "the data is in the bucket"
