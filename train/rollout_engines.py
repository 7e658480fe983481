"""What plays a train run's rollouts and held-out evals (`rollout_engine`), registered in ROLLOUT_ENGINES.

An entry says which policy scheme its copies load (collect/policies: `hf`, `vllm`), whether a single copy is the
actor itself in this process (no weights to hand over), and otherwise how to start that single copy (from a
checkpoint folder; each later checkpoint is loaded into it without a restart). `replicas` > 1 starts that many
copies of the scheme on Ray instead, whichever the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trajlake.core.registry import Registry


@dataclass(frozen=True)
class RolloutEngine:
    """One rollout engine: `scheme`, the policy scheme its copies load; `in_process`, whether one copy is the
    actor itself; `start(checkpoint_folder, policy_id)`, its own single copy otherwise."""

    scheme: str
    in_process: bool
    start: Callable[[str, str], Any] | None = None


def _start_vllm(path: str, policy_id: str) -> Any:
    from trajlake.collect.policies.vllm import VLLMPolicy

    return VLLMPolicy(path, policy_id=policy_id)


ROLLOUT_ENGINES: Registry[RolloutEngine] = Registry("rollout engine")
ROLLOUT_ENGINES.add("transformers", RolloutEngine("hf", in_process=True))
ROLLOUT_ENGINES.add("vllm", RolloutEngine("vllm", in_process=False, start=_start_vllm))

__all__ = ["ROLLOUT_ENGINES", "RolloutEngine"]
