"""The rewards bench's Python baselines: OpenManus-RL's way, one trajectory at a time (RewardComposer's composed
reward, then the allocation loop over agent segments), as tests/reward_reference.py's oracle and as the seed's
own tensor allocation, over rows first read from the lake into Python (bench/rewards.py times and checks them).
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path


def reward_reference():
    """tests/reward_reference.py, the plain-Python oracle the tests hold the compiled queries to (the benchmark is a
    script beside the tests, not a package, so the file is loaded by its path)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "reward_reference.py"
    spec = importlib.util.spec_from_file_location("reward_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sql_component(ep: dict, turns: list[dict]) -> float:
    """The Python meaning of the spec's `sql` component (the reference cannot run SQL)."""
    return ep["num_turns"] * 0.1


def load_python_inputs(lake, snapshot: int, episode_limit: int | None) -> list[tuple[dict, list[dict]]]:
    """The rows the Python loop needs, read once from the lake snapshot, grouped by episode."""
    cond = f"WHERE episode_id < 'ep{episode_limit:08d}'" if episode_limit is not None else ""
    eps = lake.query(f"SELECT * FROM episodes {cond} ORDER BY episode_id", snapshot=snapshot,
                     output="arrow").to_pylist()
    turns = lake.query(
        "SELECT episode_id, turn, observation, action_text, format_ok, step_reward, info, prompt_token_ids, "
        f"response_token_ids FROM turns {cond} ORDER BY episode_id, turn", snapshot=snapshot,
        output="arrow").to_pylist()
    grouped, i = [], 0
    for ep in eps:
        j = i
        while j < len(turns) and turns[j]["episode_id"] == ep["episode_id"]:
            j += 1
        grouped.append((ep, turns[i:j]))
        i = j
    return grouped


def python_side(spec, data: list[tuple[dict, list[dict]]]) -> tuple[float, float, float, dict]:
    """OpenManus-RL style: per trajectory, the composed reward, then the allocation over its tokens.

    Returns (loop time, of which summarising each allocation for the check, the loop's CPU time without
    that summary (pro rata), per-episode results)."""
    reference = reward_reference()

    custom = {"sql": sql_component}
    strategy, gamma = spec.allocation.strategy, spec.allocation.gamma
    out = {}
    summary_s = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for ep, turns in data:
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        alloc = reference.allocate(strategy, gamma, total, turns)
        t1 = time.perf_counter()  # the check's summary of each allocation is no part of the seed's work
        out[ep["episode_id"]] = (total, comps, math.fsum(alloc.values()), len(alloc))
        summary_s += time.perf_counter() - t1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, summary_s, cpu - summary_s * cpu / wall, out


def seed_allocate(strategy: str, gamma: float, total: float, turns: list[dict]):
    """OpenManus-RL's own allocation code (`_convert_rollout_results_to_dataproto`): the agent segments' (start,
    end) in the full sequence, a zero tensor of its length, one slice assignment per segment. The seed's
    tensor is float32; float64 here, so the result can be checked to 1e-9 (the speed is the same)."""
    import torch

    segments, pos = [], 0
    for t in turns:
        pos += len(t.get("prompt_token_ids") or [])
        n = len(t.get("response_token_ids") or [])
        if n:
            segments.append((pos, pos + n - 1))
        pos += n
    rewards = torch.zeros(pos, dtype=torch.float64)
    if segments:
        if strategy == "last_token":
            rewards[segments[-1][1]] = total
        elif strategy == "uniform_positive":
            if total > 0:
                per_token = total / max(1, sum(e - s + 1 for s, e in segments))
                for s, e in segments:
                    rewards[s:e + 1] = per_token
            elif total < 0:
                rewards[segments[-1][1]] = total
        elif strategy == "discounted":
            current = total
            for s, e in reversed(segments):
                n = e - s + 1
                rewards[s:e + 1] = current / n
                current *= gamma ** n
        else:
            raise KeyError(f"the seed has no {strategy} allocation")
    return rewards


def python_side_seed(spec, data: list[tuple[dict, list[dict]]]) -> tuple[float, dict]:
    """The same loop with the seed's tensor allocation in place of reference.allocate's dict per token."""
    import torch

    reference = reward_reference()

    torch.set_num_threads(1)
    custom = {"sql": sql_component}
    strategy, gamma = spec.allocation.strategy, spec.allocation.gamma
    out = {}
    t0 = time.perf_counter()
    for ep, turns in data:
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        alloc = seed_allocate(strategy, gamma, total, turns)
        out[ep["episode_id"]] = (total, comps, alloc)
    loop_s = time.perf_counter() - t0
    # (not timed) the per-episode (sum, count of non-zero tokens), as the other loop reports them
    out = {k: (t, c, float(a.sum()), int((a != 0).sum())) for k, (t, c, a) in out.items()}
    return loop_s, out

