"""`EvalConfig`: what `trajlake evaluate` plays and how it scores it (evaluate/run.py plays it). Its own module,
light to import: the command line builds `evaluate`'s options from its fields before anything is played."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trajlake.collect.config import (
    MAX_EPISODES,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_TASKS,
    RolloutConfig,
    check_range,
)
from trajlake.core.config_types import operational, setting
from trajlake.core.errors import TrajlakeError


@dataclass(frozen=True, kw_only=True)
class EvalConfig(RolloutConfig):
    """What `trajlake evaluate` plays and how it scores it (how each episode plays: RolloutConfig). Use the
    template and system prompt the policy was trained with."""

    config_name: ClassVar[str] = "evaluate"

    policies: tuple[str, ...] = setting(help=(
        "Policy specs to compare: hf:PATH, policy:ID, run:RUN_ID (a train run's last checkpoint), scripted:ENV..."))
    split: str = setting("test", help=(
        "Held-out split: test (or val). (RolloutConfig's field, with the held-out default.)"))
    tasks: int = setting(50, help="Tasks of the split (the first N at the difficulty).")
    samples: int = setting(1, help="Samples per task; pass@k needs samples >= k.")
    greedy: bool = setting(False, help=(
        "Greedy decoding (temperature 0); then samples must be 1 (greedy samples would all be the same)."))
    tokenizer: str | None = setting(None, help="Tokenizer folder for text policies (scripted, openai).")
    spec: str | None = operational(None, help=(
        "Reward spec TOML for the reward columns (None: the built-in default spec)."))
    ks: tuple[int, ...] = operational((1,), help=(
        "The k of pass@k, each <= `samples` (pass@k of fewer samples is not defined); 1 and `samples` are always "
        "reported too."))
    confidence: float = operational(0.95, help="Two-sided level of the confidence intervals.")
    seed: int = setting(0, help="Sampler seed.")
    progress: bool = operational(True, help="Show progress bars.")

    def __post_init__(self):
        super().__post_init__()  # types first, then RolloutConfig's checks
        # the counts' caps before anything multiplies them (an evaluation holds its tasks and episodes in memory)
        ranges = [("tasks", self.tasks, 1, MAX_TASKS), ("samples", self.samples, 1, MAX_SAMPLES),
                  ("tasks x samples", self.tasks * self.samples, 1, MAX_EPISODES), ("seed", self.seed, 0, MAX_SEED)]
        for name, value, low, high in ranges:
            message = check_range(name, value, low, high)
            if message:
                raise TrajlakeError(f"evaluate: {message}")
        if not math.isfinite(self.confidence):
            raise TrajlakeError(f"evaluate: confidence must be a finite number, got {self.confidence}")
        too_big = sorted(k for k in self.ks if k > self.samples)  # refused, not skipped: the user asked for them
        big, listed = max(too_big, default=0), ", ".join(map(str, too_big))
        checks = [
            (len(self.policies) >= 1, "give at least one policy"),
            (self.tasks >= 1, f"tasks must be >= 1, got {self.tasks}"),
            (self.samples >= 1, f"samples must be >= 1, got {self.samples}"),
            (not (self.greedy and self.samples > 1),
             f"greedy decoding with samples = {self.samples} plays the same episode {self.samples} times; "
             "drop --greedy or use --samples 1"),
            (all(k >= 1 for k in self.ks), f"every k of pass@k must be >= 1, got {self.ks}"),
            (not too_big, f"k = {listed} of pass@k {'exceeds' if len(too_big) == 1 else 'exceed'} samples = "
                          f"{self.samples}: pass@{big} needs {big} samples per task; raise --samples to {big} or drop "
                          f"--k {listed}"),
            (0 < self.confidence < 1, f"confidence must be in (0, 1), got {self.confidence}"),
            (len(set(self.policies)) == len(self.policies), f"a policy is given twice: {self.policies}"),
        ]
        for ok, message in checks:
            if not ok:
                raise TrajlakeError(f"evaluate: {message}")
        self.check_env_url()  # a built-in env given --env-url is refused as evaluate's error, before any play

    @property
    def pass_ks(self) -> list[int]:
        return sorted(set(self.ks) | {1, self.samples})
