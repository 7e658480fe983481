"""Scripted experts as policies: each built-in env's solver, replying in the action template.

Used for warm-start (SFT) data and tests. The reply is text; the rollout tokenizes it with the student
model's chat template, so expert episodes train that model directly.
"""

from __future__ import annotations

import random as random_module
from typing import Any

from trajlake.collect.envs import make_env
from trajlake.collect.envs.base import Expert
from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.collect.templates import ActionTemplate
from trajlake.core.errors import TrajlakeError

#: `scripted:ENV?OPTION=P&...`: each a probability, per turn
EXPERT_OPTIONS = {
    "noise": "a mistake instead of the expert's action: the env's hasty one (Expert.guess) where its expert has "
             "one, else another valid action (as random)",
    "random": "another valid action of the env (Expert.valid_actions) instead of the expert's",
    "verbose": "a long thought (the observation restated) instead of a short one, for templates with a thought",
}


def parse_expert_options(spec: str, query: str) -> dict[str, float]:
    """The options of `scripted:ENV?noise=P&random=R&verbose=Q` (each 0 when not given). One clear line for anything
    else."""
    out = dict.fromkeys(EXPERT_OPTIONS, 0.0)
    valid = "; ".join(f"{k}=P: {v}" for k, v in EXPERT_OPTIONS.items())
    for part in filter(None, query.split("&")):
        key, sep, value = part.partition("=")
        if key not in EXPERT_OPTIONS or not sep:
            raise TrajlakeError(f"{spec}: unknown expert option {part!r}; valid (0 <= P <= 1): {valid}")
        try:
            p = float(value)
        except ValueError:
            p = -1.0
        if not 0.0 <= p <= 1.0:
            raise TrajlakeError(f"{spec}: {key} must be a probability between 0 and 1, got {value!r}")
        out[key] = p
    return out


class ScriptedPolicy(Policy):
    """The scripted expert of env `env_name`, one expert instance per live episode.

    Options (each a probability per turn; `EXPERT_OPTIONS`) make it a noisy demonstrator:

    - `noise` P: with probability P a turn is a mistake. Where the env's expert has a hasty mistake
      (`Expert.guess`: doors opens a door without reading the sign, TextCraft crafts the goal before gathering
      its ingredients) it is that one, and a turn where the guess does not apply is the expert's; elsewhere it
      is another valid action, as with `random`.
    - `random` P: with probability P a turn plays another action the env accepts now
      (`Expert.valid_actions`: another door, a move through another open side, another number, a get or a
      craft the inventory allows), never the expert's own. On turns `noise` left alone, when both are given.
    - `verbose` Q: with probability Q a turn's thought restates the whole observation before the action
      instead of the short "I will ACTION." (a spread of reply lengths at equal success, e.g. for a length
      penalty to act on).

    The expert reads every observation (`act` runs on noisy turns too) and is told which action was played
    instead of its own (`Expert.overruled`), so it plays on from wherever a mistake left it. All draws are
    seeded by the run's sampling seed and the episode key: a resumed or repeated collect replays the same
    demonstrations, and another seed draws others. An env whose expert has neither a hasty mistake nor a list
    of valid actions is refused noise and random.
    """

    exact_tokens = False

    def __init__(self, env_name: str, template: ActionTemplate, tokenizer: Any = None, noise: float = 0.0,
                 verbose: float = 0.0, random: float = 0.0):
        self.env_name = env_name
        self.template = template
        self.tokenizer = tokenizer
        self.noise, self.random, self.verbose = noise, random, verbose
        options = "&".join(f"{k}={v:g}" for k, v in (("noise", noise), ("random", random), ("verbose", verbose))
                           if v)
        self.policy_id = f"scripted:{env_name}" + (f"?{options}" if options else "")
        if verbose and "{thought}" not in template.render_format:
            raise TrajlakeError(f"{self.policy_id}: the {template.name} template has no thought to make verbose "
                                "(use think_action or react)")
        self._env = make_env(env_name)
        expert = self._env.expert()  # an env without an expert fails here, before anything is played
        self._hasty = type(expert).guess is not Expert.guess
        lists = type(expert).valid_actions is not Expert.valid_actions
        if noise and not (self._hasty or lists):
            raise TrajlakeError(f"{self.policy_id}: the {env_name} expert has neither a hasty mistake (Expert.guess) "
                                "nor a list of valid actions (Expert.valid_actions), so it has no noisy variant "
                                f"(use scripted:{env_name})")
        if random and not lists:
            raise TrajlakeError(f"{self.policy_id}: the {env_name} expert lists no valid actions "
                                f"(Expert.valid_actions), so it has no random variant (use scripted:{env_name})")
        self._experts: dict[str, Any] = {}
        self._rngs: dict[str, random_module.Random] = {}

    def start_episode(self, key: str, task: Any) -> None:
        if getattr(task, "env", self.env_name) != self.env_name:  # an oracle would misread another env's task
            raise TrajlakeError(f"{self.policy_id} plays {self.env_name} tasks, not {task.env!r} ({task.task_id}): "
                                f"use scripted:{task.env}")
        expert = self._env.expert()
        expert.reset(task)
        self._experts[key] = expert

    def end_episode(self, key: str) -> None:
        self._experts.pop(key, None)
        self._rngs.pop(key, None)

    def _rng(self, key: str, seed: int) -> random_module.Random:
        return self._rngs.setdefault(key, random_module.Random(f"noise:{seed}:{key}"))

    def _action(self, key: str, observation: str, seed: int) -> str:
        rng, expert = self._rng(key, seed), self._experts[key]
        action = expert.act(observation)
        mistake = None
        if self.noise and rng.random() < self.noise:
            mistake = expert.guess(observation, rng) if self._hasty else self._other(expert, observation, action, rng)
        elif self.random and rng.random() < self.random:
            mistake = self._other(expert, observation, action, rng)
        if mistake is None or mistake == action:
            return action
        expert.overruled(mistake)
        return mistake

    @staticmethod
    def _other(expert: Expert, observation: str, action: str, rng: random_module.Random) -> str | None:
        """A valid action other than `action`, drawn uniformly; None where there is none."""
        others = [a for a in expert.valid_actions(observation) or [] if a != action]
        return rng.choice(others) if others else None

    def _thought(self, key: str, observation: str, action: str, seed: int) -> str:
        if self.verbose and self._rng(key, seed).random() < self.verbose:
            return f"{' '.join(observation.split())} So I will {action}."
        return f"I will {action}."

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        out = []
        for r in requests:
            action = self._action(r.key, r.observation, params.seed)
            thought = self._thought(r.key, r.observation, action, params.seed)
            out.append(Generation(text=self.template.render(action, thought=thought)))
        return out
