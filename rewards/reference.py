"""Plain-Python reference of rewards and allocations, one trajectory at a time (the seed's style).

This is the meaning the compiled queries must reproduce: the property tests check query == reference, and
bench/rewards.py times the queries against this loop. It reads records (dicts) and does no SQL, except
that `sql` and `process expr` components cannot be evaluated without SQL: the reference takes their
per-episode / per-turn values as callables.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajlake.rewards.spec import RewardSpec


def _score(info: Any) -> float | None:
    info = json.loads(info) if isinstance(info, str) else (info or {})
    v = info.get("score") if isinstance(info, dict) else None
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _valid(info: Any) -> bool:
    info = json.loads(info) if isinstance(info, str) else (info or {})
    return bool(isinstance(info, dict) and info.get("valid") is True)


def process_values(params: Mapping, turns: Sequence[Mapping], expr: Callable | None = None) -> list[float]:
    """One process component's per-turn values."""
    out, prev = [], None
    for i, t in enumerate(turns):
        if params.get("expr") is not None:
            v = float(expr(t))
        else:
            signal = {
                "format_ok": bool(t.get("format_ok")),
                "valid_action": _valid(t.get("info")),
                "new_observation": i == 0 or t.get("observation") != prev,
                "positive_step": (t.get("step_reward") or 0) > 0,
            }[params["signal"]]
            v = params["reward"] if signal else params["penalty"]
        prev = t.get("observation")
        out.append(float(v))
    return out


def component_value(kind: str, p: Mapping, ep: Mapping, turns: Sequence[Mapping],
                    custom: Callable | None = None) -> float:
    """One component's value for one episode (turns sorted by turn)."""
    if kind == "goal":
        if ep.get("success"):
            return float(p["success"])
        if ep.get("status") == "ok" and ep.get("success") is False:
            return float(p["failure"])
        score = _score(turns[-1].get("info")) if turns else None
        if score is not None:
            return score
        return float(ep["env_reward"]) if ep.get("env_reward") is not None else 0.0
    if kind == "length_penalty":
        sizes = [len(t.get("response_token_ids") or []) if p["unit"] == "tokens" else len(t.get("action_text") or "")
                 for t in turns]
        n = (sizes[-1] if sizes else 0) if p["scope"] == "last" else sum(sizes)
        excess = (max(n - p["max"], 0) if p["max"] is not None else 0)
        excess += max(p["min"] - n, 0) if p["min"] is not None else 0
        shaped = {"linear": excess, "quadratic": excess ** 2, "log": math.log1p(excess)}[p["shape"]]
        return -p["scale"] * shaped
    if kind == "format":
        hits = [1.0 if re.search(p["pattern"], t.get("action_text") or "") else 0.0 for t in turns]
        if not hits:
            return 0.0
        return sum(hits) / len(hits) if p["over"] == "each" else hits[-1]
    if kind == "env_reward":
        v = sum((t.get("step_reward") or 0.0) * p["discount"] ** t["turn"] for t in turns)
        if p["clip_min"] is not None:
            v = max(v, p["clip_min"])
        if p["clip_max"] is not None:
            v = min(v, p["clip_max"])
        return v
    if kind == "process":
        return sum(process_values(p, turns, custom))
    if kind in ("sql", "python"):
        return float(custom(ep, turns))
    raise KeyError(kind)


def episode_reward(spec: RewardSpec, ep: Mapping, turns: Sequence[Mapping],
                   custom: Mapping[str, Callable] | None = None) -> tuple[float, dict[str, float]]:
    """(total, components) of one episode, like OpenManus-RL's RewardComposer.compute_total_reward."""
    custom = custom or {}
    comps = {c.name: component_value(c.kind, c.params, ep, turns, custom.get(c.name)) for c in spec.components}
    total = sum(c.weight * comps[c.name] for c in spec.components)
    return total, comps


def allocate(strategy: str, gamma: float, total: float, turns: Sequence[Mapping],
             process: Sequence[float] | None = None) -> dict[int, float]:
    """Token position -> reward (non-zero only), walking the agent segments like the seed does."""
    segments, pos = [], 0  # (turn index, start, end inclusive) of each non-empty agent segment
    for i, t in enumerate(turns):
        pos += len(t.get("prompt_token_ids") or [])
        n = len(t.get("response_token_ids") or [])
        if n:
            segments.append((i, pos, pos + n - 1))
        pos += n
    out: dict[int, float] = {}
    if not segments:
        return out
    last_end = segments[-1][2]
    if strategy == "last_token":
        out[last_end] = total
    elif strategy == "uniform_positive":
        if total > 0:
            agent = sum(e - s + 1 for _, s, e in segments)
            for _, s, e in segments:
                for k in range(s, e + 1):
                    out[k] = total / agent
        elif total < 0:
            out[last_end] = total
    elif strategy == "discounted":
        current = total
        for _, s, e in reversed(segments):
            n = e - s + 1
            for k in range(s, e + 1):
                out[k] = current / n
            current *= gamma ** n
    elif strategy == "per_turn":
        process = list(process or [0.0] * len(turns))
        on_segments = sum(process[i] for i, _, _ in segments)
        for i, _, e in segments:
            out[e] = out.get(e, 0.0) + process[i]
        out[last_end] = out.get(last_end, 0.0) + total - on_segments
    else:
        raise KeyError(strategy)
    return {k: v for k, v in out.items() if v != 0}
