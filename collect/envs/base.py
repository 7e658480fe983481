"""The protocol every built-in text environment follows, and the machinery they share.

An `Env` turns a `Task` into a short multi-turn text game: `reset(task)` gives the first observation,
`step(action)` answers one action with `(observation, reward, done, info)`. Subclasses only describe their
world (`_generate`, `_start`, `_act`); this module does the bookkeeping that must be identical everywhere:
task ids and seeds, held-out splits, action normalisation, invalid actions, the step limit, and the
errors for misuse.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from abc import ABC, abstractmethod
from typing import Any

from trajlake.schemas.records import Task

SPLITS = ("train", "val", "test")
#: Tasks per difficulty that `tasks(split)` gives when no `n` is asked for.
DEFAULT_N = {"train": 1000, "val": 100, "test": 100}
# Content buckets (out of 10) each split owns. Seeds alone are not enough to hold tasks out: small worlds
# (a 3x3 maze, three doors) repeat across seeds, so a split only keeps tasks whose *content* hashes into its
# buckets, and no task text can ever appear in two splits.
_BUCKETS = {"train": range(0, 8), "val": range(8, 9), "test": range(9, 10)}
_MAX_ATTEMPTS = 1000  # seeds tried per task index; a split's bucket is hit with p >= 0.1 per try


class InvalidAction(Exception):
    """Raised by `Env._act` for an action it does not understand; `step` turns it into an observation."""


class Expert(ABC):
    """A scripted policy (an oracle: it may read the task's ground truth) for warm-start data and tests."""

    def reset(self, task: Task) -> None:
        """Start a new episode of `task`."""
        self.task = task

    @abstractmethod
    def act(self, observation: str) -> str:
        """The next action, as the plain action string the env parses (e.g. "move north")."""

    def guess(self, observation: str, rng: random.Random) -> str | None:
        """What a hasty demonstrator does instead of `act`: the env's typical mistake, made from what the player
        has been told, without the ground truth (None where it would act as the expert does). The noisy
        expert (`scripted:ENV?noise=P`) plays it with probability P. It is asked right after `act` answered
        the same observation, so it may read what `act` learned from it. An expert that does not override
        this has no hasty mistake: its noise is another valid action (`valid_actions`) instead."""
        return None

    def valid_actions(self, observation: str) -> list[str] | None:
        """The actions the env would accept now (understood and playable, not necessarily good), read from
        `observation` and what the expert has tracked; the expert's own next action may be among them. A noisy
        demonstrator (`scripted:ENV?random=P`, and `noise=P` where there is no `guess`) plays another one of
        them. Asked right after `act` answered the same observation. None (this default) where the expert
        cannot tell: such an expert has no random variant. An empty list is a turn with nothing else to play."""
        return None

    def overruled(self, action: str) -> None:
        """The action `act` just returned was not played: `action` (a noisy demonstrator's mistake) was. An
        expert that follows a precomputed plan, or reads the next reply as the answer to its own action,
        updates its state here; this default does nothing, which is right for an expert that reads everything
        it needs from each observation."""


class Env(ABC):
    """A seeded, deterministic, pure-Python text environment.

    Subclasses set `name`, `description`, `action_help`, `max_steps` (difficulty -> step limit) and
    implement `_generate`, `_start`, `_act` and `expert`. Instances hold all episode state, so several
    instances of one env run side by side.
    """

    name: str = ""
    description: str = ""
    action_help: str = ""
    #: difficulty -> the most steps (valid or not) an episode may take before it ends unsuccessfully
    max_steps: dict[int, int] = {}
    #: the action template an episode is played with when none is given (collect.templates)
    default_template: str = "think_action"
    #: made with the URL of a server it plays (AgentGym's env servers); the built-ins need no arguments
    remote: bool = False
    #: other names `scripted:NAME` may give this env's expert (`textcraft` for `agentgym/textcraft`)
    expert_aliases: tuple[str, ...] = ()
    #: split -> how many tasks it holds (None: no end) of a server's env whose tasks are its data indices; empty
    #: for envs that draw their tasks from seeds (the built-ins: splits never share a seed) or whose server lists
    #: them. `trajlake envs` shows these, the scheme and the difficulty per split.
    split_sizes: dict[str, int | None] = {}
    #: how such a server's data indices are dealt to the splits ("stratified-v1", "contiguous"); "" for the others
    split_scheme: str = ""
    #: split -> {difficulty: tasks} where the server's data difficulty is known (TextCraft's crafting depth)
    split_difficulty: dict[str, dict[int, int]] = {}

    def __init__(self, invalid_penalty: float = 0.0):
        """`invalid_penalty` is the reward (<= 0) for an action the env did not understand."""
        self.invalid_penalty = float(invalid_penalty)
        self.task: Task | None = None
        self.done = False
        self.steps = 0

    # ---- tasks -------------------------------------------------------------------------------------

    @property
    def difficulties(self) -> tuple[int, ...]:
        """The difficulty levels, easiest first."""
        return tuple(sorted(self.max_steps))

    def tasks(self, split: str, n: int | None = None, difficulty: int | None = None) -> list[Task]:
        """A deterministic list of `n` tasks of `split` ("train", "val" or "test").

        With `difficulty` None the difficulties are interleaved (easiest first, round robin), and task i of
        difficulty d is always the same task whatever `n` is. `n` None gives `DEFAULT_N[split]` tasks per
        difficulty. Splits never share a seed nor a task's content.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if difficulty is not None and difficulty not in self.max_steps:
            raise ValueError(f"unknown difficulty {difficulty!r} for {self.name}; valid: {self.difficulties}")
        levels = self.difficulties if difficulty is None else (difficulty,)
        if n is None:
            n = DEFAULT_N[split] * len(levels)
        return [self._task(split, levels[i % len(levels)], i // len(levels)) for i in range(n)]

    def split_size(self, split: str) -> int | None:
        """How many tasks `split` holds; None: no end (the built-ins draw tasks from seeds, splits never meet)."""
        return None

    def _task(self, split: str, difficulty: int, index: int) -> Task:
        base = SPLITS.index(split) * 10**12 + difficulty * 10**10 + index * _MAX_ATTEMPTS
        for attempt in range(_MAX_ATTEMPTS):
            seed = base + attempt  # decimal digits read split, difficulty, index, attempt
            instruction, truth, meta = self._generate(random.Random(seed), difficulty)
            key = json.dumps([self.name, difficulty, instruction, truth], sort_keys=True)
            if int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 10 in _BUCKETS[split]:
                break
        meta = {"difficulty": difficulty, "max_steps": self.max_steps[difficulty], **meta}
        return Task(task_id=f"{self.name}/{split}/{difficulty}/{index}", env=self.name, split=split,
                    instruction=instruction, seed=seed, ground_truth=truth, meta=meta)

    @abstractmethod
    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        """One task's (instruction, ground_truth, extra meta), all JSON-serialisable, drawn from `rng`."""

    # ---- episodes ----------------------------------------------------------------------------------

    def check_server(self) -> None:
        """Refuse, before anything is played or stored, a server that serves another environment. A remote env
        (AgentGymClient) checks its server's greeting; the envs that run in process have no server to check."""

    def reset(self, task: Task) -> str:
        """Start an episode of `task` and return the first observation (it repeats the instruction)."""
        if task.env != self.name:
            raise ValueError(f"task {task.task_id!r} is for env {task.env!r}, not {self.name!r}")
        self.task, self.done, self.steps = task, False, 0
        self.difficulty = int(task.meta["difficulty"])
        self.limit = int(task.meta.get("max_steps", self.max_steps[self.difficulty]))
        return f"{task.instruction}\n{self._start(task)}"

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Answer one action with (observation, reward, done, info).

        info always has `valid` (the action was understood) and `step`; when done also `success` and
        `score` (0..1). An invalid action never raises: it costs a step and earns `invalid_penalty`.
        """
        if self.task is None:
            raise RuntimeError(f"{self.name}: call reset(task) before step()")
        if self.done:
            raise RuntimeError(f"{self.name}: the episode of {self.task.task_id!r} is over; call reset(task)")
        self.steps += 1
        try:
            obs, reward, done, info = self._act(normalize(action))
            info = {"valid": True, **info}
        except InvalidAction as e:
            obs, reward, done = f"Invalid action. {e} Actions: {self.action_help}", self.invalid_penalty, False
            info = {"valid": False}
        if not done and self.steps >= self.limit:
            obs, done = f"{obs}\nOut of steps. You lose.", True
            info["success"] = False
        if done:
            info.setdefault("success", False)
            info.setdefault("score", 1.0 if info["success"] else min(1.0, max(0.0, self.progress())))
        info["step"] = self.steps
        self.done = done
        return obs, float(reward), done, info

    @abstractmethod
    def _start(self, task: Task) -> str:
        """Set up the episode state from `task` (use only the task, never shared state) and describe it."""

    @abstractmethod
    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply a normalised action; raise `InvalidAction` with a short hint if it is not understood."""

    def progress(self) -> float:
        """How far the episode got (0..1), reported as `score` when an episode ends without success."""
        return 0.0

    @abstractmethod
    def expert(self) -> Expert:
        """A scripted expert that solves every task of this env optimally or nearly so."""

    def close(self) -> None:
        """Release the episode (the built-in envs hold no outside resources)."""
        self.task, self.done = None, True


def normalize(action: Any) -> str:
    """Lower-case, single-spaced, without surrounding punctuation: "  Open the Red door." -> "open the red door"."""
    if not isinstance(action, str):
        return ""
    return re.sub(r"\s+", " ", action).strip(" .!?\"'`").lower()


def parse(action: str, verbs: tuple[str, ...]) -> tuple[str, str]:
    """Split "verb argument" into (verb, argument), dropping an article; InvalidAction for another verb."""
    verb, _, arg = action.partition(" ")
    if verb not in verbs:
        raise InvalidAction(f"Unknown action {action[:30]!r}." if action else "Empty action.")
    arg = re.sub(r"^(the|a|an) ", "", arg)
    return verb, arg
