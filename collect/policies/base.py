"""The policy interface the rollout loop drives, and the sampling settings every backend shares.

A policy answers a batch of requests in one call. Token policies (transformers, vLLM) read each request's
full context as token ids and return the ids they sampled with their logprobs, which are stored as sampled.
Text policies (an OpenAI-compatible endpoint, scripted experts) read the chat messages and return text,
which the rollout loop tokenizes with the chat template (their token ids are then not sampled ids, and
the run's config says so: `exact_tokens = false`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """How replies are sampled.

    temperature: 0 means greedy. top_p: nucleus sampling mass. max_new_tokens: reply length cap.
    seed: seeds the backend's sampler at the start of a run (batched sampling has one random stream,
    so samples of one task differ while the run as a whole is reproducible).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Request:
    """One live episode's turn: its full context as ids (token policies) and as messages (text policies)."""

    key: str  # the episode's id, so stateful policies (scripted experts) can tell episodes apart
    prompt_ids: list[int]
    messages: list[dict[str, str]]
    task: Any = None  # the schemas.Task being played
    observation: str = ""


@dataclass
class Generation:
    """A reply: sampled ids and logprobs for token policies, text for text policies."""

    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    text: str | None = None
    finish_reason: str = "stop"  # "stop" | "length"
    meta: dict[str, Any] = field(default_factory=dict)


class Policy(ABC):
    """A batched policy. `policy_id` is what episodes record; `tokenizer` is None for text-only ones."""

    policy_id: str
    tokenizer: Any = None
    #: True when token_ids are what the model sampled (stored as is); False for text policies
    exact_tokens: bool = False
    #: the model folder, when the policy is a local checkpoint
    model_path: str | None = None

    @abstractmethod
    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        """Answer every request (same order), in as few model calls as the backend allows."""

    def reset_rng(self, seed: int) -> None:
        """Seed the sampler at the start of a run, so a run is reproducible."""

    def start_episode(self, key: str, task: Any) -> None:
        """Called when an episode starts (scripted experts reset here)."""

    def end_episode(self, key: str) -> None:
        """Called when an episode ends."""

    def close(self) -> None:
        """Release the model or connection."""

    def nodes(self) -> list[str]:
        """The Ray node id of each copy of the policy running on Ray actors (none: it runs in this process)."""
        return []
