"""Plain-Python reference of rewards and allocations, one trajectory at a time (the seed's style).

This is the meaning the compiled queries must reproduce: the property tests check query == reference, and
bench/rewards.py times the queries against this loop. It reads records (dicts) and does no SQL, except
that `sql` and `process expr` components cannot be evaluated without SQL: the reference takes their
per-episode / per-turn values as callables.

It lives with the tests, apart from rewards/kinds/, on purpose: an oracle written independently of the
kinds' SQL builders, sharing none of their code, so a wrong builder cannot make its own check pass.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajlake.rewards.spec import RewardSpec


def _info(info: Any) -> Any:
    return json.loads(info) if isinstance(info, str) else info


def _score(info: Any) -> float | None:
    info = _info(info) or {}
    v = info.get("score") if isinstance(info, dict) else None
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _valid(info: Any) -> bool | None:
    """info.valid: True only for JSON true, None (unknown) when absent or null, else False."""
    info = _info(info)
    v = info.get("valid") if isinstance(info, dict) else None
    return None if v is None else v is True


def _openmanus_goal(p: Mapping, turns: Sequence[Mapping]) -> float:
    """OpenManus-RL's GoalReward: the last turn's info, read only when that turn ended the episode."""
    if not turns or not turns[-1].get("done"):
        return 0.0
    info = _info(turns[-1].get("info"))
    if not isinstance(info, dict):
        return 0.0
    if info.get("success") is True:
        return float(p["success"])
    if info.get("fail") is True:
        return float(p["failure"])
    try:
        return float(info.get("score", 0.0))
    except (TypeError, ValueError):
        return 0.0


def process_values(params: Mapping, turns: Sequence[Mapping], expr: Callable | None = None) -> list[float]:
    """One process component's per-turn values; a signal that is unknown (None) gives 0, or the penalty with
    `unknown = "false"`."""
    out, prev = [], None
    for i, t in enumerate(turns):
        obs = t.get("observation")
        if params.get("expr") is not None:
            v = float(expr(t))
        else:
            step = t.get("step_reward")
            result = _result(turns, i)
            signal = {
                "format_ok": t.get("format_ok"),
                "valid_action": _valid(t.get("info")),
                "new_observation": True if i == 0 else None if obs is None or prev is None else obs != prev,
                "positive_step": None if step is None else step > 0,
                "result_matches": None if result is None or params.get("pattern") is None
                else re.search(params["pattern"], result) is not None,
            }[params["signal"]]
            if signal is None and params.get("unknown", "skip") == "false":
                signal = False
            v = 0.0 if signal is None else params["reward"] if signal else params["penalty"]
        prev = obs
        out.append(float(v))
    return out


def _result(turns: Sequence[Mapping], i: int) -> str | None:
    """What turn i's action got back: the next turn's observation, or on the last turn info.final_observation."""
    if i + 1 < len(turns):
        return turns[i + 1].get("observation")
    info = turns[i].get("info")
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            return None
    value = info.get("final_observation") if isinstance(info, Mapping) else None
    return value if isinstance(value, str) else None


def _format_hits(p: Mapping, turns: Sequence[Mapping]) -> list[float | None]:
    if p.get("pattern") is None:
        return [None if t.get("format_ok") is None else float(t["format_ok"]) for t in turns]
    flags = re.DOTALL if p.get("dotall") else 0
    return [1.0 if re.search(p["pattern"], t.get("action_text") or "", flags) else 0.0 for t in turns]


def component_value(kind: str, p: Mapping, ep: Mapping, turns: Sequence[Mapping],
                    custom: Callable | None = None) -> float:
    """One component's value for one episode (turns sorted by turn)."""
    if kind == "goal":
        if p.get("mode", "episode") == "openmanus":
            return _openmanus_goal(p, turns)
        if ep.get("success"):
            return float(p["success"])
        if ep.get("status") == "ok" and ep.get("success") is False:
            return float(p["failure"])
        if ep.get("status") == "truncated" and p.get("truncated", "score") == "failure":
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
        if p.get("envs") is not None and ep.get("env") not in p["envs"]:
            return 0.0
        hits = _format_hits(p, turns)
        if p["over"] == "last":
            return (hits[-1] or 0.0) if hits else 0.0
        known = [h for h in hits if h is not None]
        return sum(known) / len(known) if known else 0.0
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
