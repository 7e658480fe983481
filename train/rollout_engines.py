"""What plays a train run's rollouts and held-out evals (`rollout_engine`), registered in ROLLOUT_ENGINES.

An entry says which policy scheme its copies load (collect/policies: `hf`, `vllm`; the scheme's `from_checkpoint`
starts one on a checkpoint folder, and each later checkpoint is loaded into it without a restart) and whether a
single copy is the actor itself in this process (no weights to hand over). `replicas` > 1 starts that many
copies of the scheme on Ray instead, whichever the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trajlake.core.registry import Registry


@dataclass(frozen=True)
class RolloutEngine:
    """One rollout engine: `scheme`, the policy scheme its copies load (its `from_checkpoint`); `in_process`,
    whether one copy is the actor itself."""

    scheme: str
    in_process: bool

    def start(self, path: str, policy_id: str) -> Any:
        """Its own single copy, playing the checkpoint folder `path`."""
        from trajlake.collect.policies import POLICY_SCHEMES

        return POLICY_SCHEMES[self.scheme].from_checkpoint(path, policy_id)


ROLLOUT_ENGINES: Registry[RolloutEngine] = Registry("rollout engine")
ROLLOUT_ENGINES.add("transformers", RolloutEngine("hf", in_process=True))
ROLLOUT_ENGINES.add("vllm", RolloutEngine("vllm", in_process=False))

__all__ = ["ROLLOUT_ENGINES", "RolloutEngine"]
