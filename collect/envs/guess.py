"""`guess`: find a secret number in a range from "higher" / "lower" feedback.

The guess budget leaves binary search two spare turns and makes a linear scan fail from difficulty 2 on.
Ranges start at a random low end so that held-out splits hold different games even at difficulty 1.
"""

from __future__ import annotations

import random
import re

from trajlake.collect.envs.base import Env, Expert, InvalidAction, parse
from trajlake.schemas.records import Task

#: difficulty -> (numbers in the range, guesses allowed); binary search needs at most 3, 4, 6, 7
LEVELS = {1: (4, 5), 2: (10, 6), 3: (50, 8), 4: (100, 9)}
FEEDBACK_RE = re.compile(r"(Higher|Lower) than (-?\d+)")


class GuessEnv(Env):
    """Number guessing. Actions: "guess N"."""

    name = "guess"
    description = "Guess a secret number from higher/lower feedback (4 numbers in 5 guesses up to 100 in 9)."
    action_help = "guess <number>."
    max_steps = {d: guesses for d, (_, guesses) in LEVELS.items()}

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        size, _ = LEVELS[difficulty]
        lo = rng.randint(1, 20)
        hi = lo + size - 1
        target = rng.randint(lo, hi)
        instruction = "Guess the secret number. After each guess you hear higher or lower."
        return instruction, {"low": lo, "high": hi, "target": target}, {"optimal_steps": _bisect_steps(lo, hi, target)}

    def _start(self, task: Task) -> str:
        truth = task.ground_truth
        self.low, self.high, self.target = truth["low"], truth["high"], truth["target"]
        self.lo, self.hi = self.low, self.high  # what the feedback so far still allows, for `progress`
        return f"The number is from {self.low} to {self.high}. Guesses left: {self.limit}."

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        _, arg = parse(action, ("guess",))
        if not re.fullmatch(r"-?\d{1,9}", arg) or not self.low <= int(arg) <= self.high:
            raise InvalidAction(f"Guess a number from {self.low} to {self.high}.")
        n = int(arg)
        if n == self.target:
            return f"{n} is correct. You win!", 1.0, True, {"success": True}
        if n < self.target:
            self.lo = max(self.lo, n + 1)
            word = "Higher"
        else:
            self.hi = min(self.hi, n - 1)
            word = "Lower"
        return f"{word} than {n}. Guesses left: {self.limit - self.steps}.", 0.0, False, {}

    def progress(self) -> float:
        """How much of the range the feedback has ruled out."""
        return 1 - (self.hi - self.lo) / max(1, self.high - self.low)

    def expert(self) -> Expert:
        return GuessExpert()


def _bisect_steps(lo: int, hi: int, target: int) -> int:
    """Guesses binary search (lower middle) takes to hit `target`."""
    steps = 1
    while (mid := (lo + hi) // 2) != target:
        lo, hi = (mid + 1, hi) if mid < target else (lo, mid - 1)
        steps += 1
    return steps


class GuessExpert(Expert):
    """Binary search driven only by the feedback in the observations (never by the target)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.low, self.high = task.ground_truth["low"], task.ground_truth["high"]  # told in the first observation
        self.lo, self.hi = self.low, self.high

    def act(self, observation: str) -> str:
        for word, n in FEEDBACK_RE.findall(observation):
            if word == "Higher":
                self.lo = max(self.lo, int(n) + 1)
            else:
                self.hi = min(self.hi, int(n) - 1)
        return f"guess {(self.lo + self.hi) // 2}"

    def valid_actions(self, observation: str) -> list[str]:
        """Every number of the range (one the feedback already ruled out too: a wasted guess, but accepted).
        The expert reads the feedback to whatever was guessed, so it needs no word of a guess it did not make."""
        return [f"guess {n}" for n in range(self.low, self.high + 1)]
