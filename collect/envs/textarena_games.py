"""textarena's single-player games as trajlake envs (see thirdparty.py for the rules the wrappers follow); their
experts are in textarena_experts.py."""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from trajlake.collect.envs.base import Expert
from trajlake.collect.envs.textarena_experts import (
    FrozenLakeExpert,
    GuessTheNumberExpert,
    HanoiExpert,
    SudokuExpert,
)
from trajlake.collect.envs.thirdparty_base import ThirdPartyEnv, env_error, require_package
from trajlake.schemas.records import Task


class Variant(NamedTuple):
    """One textarena variant: its registry id, the parameters the wrapper and expert rely on, trajlake's limit."""

    env_id: str
    params: dict
    max_steps: int


#: game -> difficulty -> variant. `params` repeat textarena's registry kwargs (a test checks they agree).
VARIANTS: dict[str, dict[int, Variant]] = {
    "TowerOfHanoi": {
        1: Variant("TowerOfHanoi-v0", {"num_disks": 3, "max_turns": 14}, 29),
        2: Variant("TowerOfHanoi-v0-medium", {"num_disks": 4, "max_turns": 30}, 61),
        3: Variant("TowerOfHanoi-v0-hard", {"num_disks": 5, "max_turns": 62}, 125),
        4: Variant("TowerOfHanoi-v0-hardcore", {"num_disks": 6, "max_turns": 126}, 253),
        5: Variant("TowerOfHanoi-v0-extreme", {"num_disks": 7, "max_turns": 254}, 509),
    },
    "GuessTheNumber": {
        1: Variant("GuessTheNumber-v0", {"min_number": 1, "max_number": 20, "max_turns": 10}, 21),
        2: Variant("GuessTheNumber-v0-hardcore", {"min_number": 1, "max_number": 50, "max_turns": 10}, 21),
    },
    "FrozenLake": {  # the game's own limit is 100 moves; trajlake's is tighter
        1: Variant("FrozenLake-v0", {"size": 4, "num_holes": 3, "randomize_start_goal": False}, 20),
        2: Variant("FrozenLake-v0-random", {"size": 4, "num_holes": 3, "randomize_start_goal": True}, 20),
        3: Variant("FrozenLake-v0-hardcore", {"size": 5, "num_holes": 6, "randomize_start_goal": False}, 30),
    },
    "Minesweeper": {
        1: Variant("Minesweeper-v0-small", {"rows": 5, "cols": 5, "num_mines": 5, "max_turns": 100}, 40),
        2: Variant("Minesweeper-v0", {"rows": 8, "cols": 8, "num_mines": 10, "max_turns": 100}, 100),
        3: Variant("Minesweeper-v0-medium", {"rows": 10, "cols": 10, "num_mines": 20, "max_turns": 100}, 160),
        4: Variant("Minesweeper-v0-hard", {"rows": 12, "cols": 12, "num_mines": 30, "max_turns": 100}, 201),
    },
    # Sudoku-v0-hard (20 clues) is left out: generating one puzzle takes ~7 s (uniqueness checks).
    "Sudoku": {
        1: Variant("Sudoku-v0-very-easy", {"clues": 75, "max_turns": 100}, 20),
        2: Variant("Sudoku-v0-easy", {"clues": 70, "max_turns": 100}, 30),
        3: Variant("Sudoku-v0", {"clues": 60, "max_turns": 100}, 50),
        4: Variant("Sudoku-v0-medium", {"clues": 40, "max_turns": 100}, 100),
    },
}


class TextArenaEnv(ThirdPartyEnv):
    """A single-player textarena game. Subclasses set `game`, the `Env` texts and `expert`."""

    package = "textarena"
    game: str = ""
    title: str = ""

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        v = VARIANTS[self.game][difficulty]
        instruction = f"{self.title} (textarena {v.env_id}). Actions: {self.action_help}"
        truth = {"env_id": v.env_id, **v.params, "game_seed": rng.randrange(2**31)}
        return instruction, truth, self._meta(v)

    def _meta(self, variant: Variant) -> dict:
        return {"package": "textarena"}

    def _start(self, task: Task) -> str:
        ta = require_package("textarena", self.name)
        self._rng_state = None
        with self._sandbox():
            seed = int(task.ground_truth["game_seed"])
            random.seed(seed)  # the games seed it themselves too; this covers any draw made before they do
            self._game = ta.make(f"{task.ground_truth['env_id']}-raw")  # unwrapped: we format observations
            self._game.reset(num_players=1, seed=seed)
            _, messages = self._game.get_observation()
        return _render(messages)

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        if "[" not in action and "]" not in action:
            action = f"[{action}]"
        game = self._game
        with self._sandbox():
            done, _ = game.step(action)
            _, messages = game.get_observation()
            state = game.state
            info = state.game_info[0]
            valid = state.error_count == 0 and not info.get("invalid_move")
            reward = (state.rewards or {}).get(0) if done else None
        obs = _render(messages)
        out: dict[str, Any] = {"valid": valid}
        if not done:
            return obs or "Your move.", 0.0 if valid else self.invalid_penalty, False, out
        reason = info.get("reason") or "The game is over."
        success = bool(valid and reward is not None and reward >= 1.0)
        out.update(success=success, score=1.0 if success else _clip01(reward), reason=reason)
        obs = f"{obs}\n{reason}".strip()
        return obs, (1.0 if success else 0.0) + (0.0 if valid else self.invalid_penalty), True, out

    def progress(self) -> float:
        if self._game is None:
            return 0.0
        try:
            with self._sandbox():
                return _clip01(self._game._get_percentage_completion())
        except Exception:  # a game without partial credit
            return 0.0


def _render(messages: list) -> str:
    """textarena's (sender, text, type) messages -> one text, without the echo of the player's own action."""
    return "\n".join(str(m[1]).strip() for m in messages if getattr(m[2], "name", "") != "PLAYER_ACTION").strip()


def _clip01(x: Any) -> float:
    try:
        return min(1.0, max(0.0, float(x)))
    except (TypeError, ValueError):
        return 0.0


def _limits(game: str) -> dict[int, int]:
    return {d: v.max_steps for d, v in VARIANTS[game].items()}


class TowerOfHanoiEnv(TextArenaEnv):
    name = "textarena/TowerOfHanoi"
    game = "TowerOfHanoi"
    title = "Tower of Hanoi: move every disk from tower A to tower C"
    description = "textarena's Tower of Hanoi: move 3 to 7 disks from tower A to C, one disk per move."
    action_help = "[source target], e.g. [A C]."
    max_steps = _limits(game)

    def _meta(self, variant: Variant) -> dict:
        return {"package": "textarena", "optimal_steps": 2 ** variant.params["num_disks"] - 1}

    def expert(self) -> Expert:
        return HanoiExpert()


class GuessTheNumberEnv(TextArenaEnv):
    name = "textarena/GuessTheNumber"
    game = "GuessTheNumber"
    title = "Guess the secret number from higher/lower hints"
    description = "textarena's GuessTheNumber: find a number in 1..20 (or 1..50) in 10 guesses."
    action_help = "[number], e.g. [10]."
    max_steps = _limits(game)

    def expert(self) -> Expert:
        return GuessTheNumberExpert()


class FrozenLakeEnv(TextArenaEnv):
    name = "textarena/FrozenLake"
    game = "FrozenLake"
    title = "Frozen Lake: walk to the goal G without falling into a hole H"
    description = "textarena's FrozenLake: walk across a 4x4 or 5x5 grid to the goal, avoiding holes."
    action_help = "[up], [down], [left] or [right]."
    max_steps = _limits(game)

    def expert(self) -> Expert:
        return FrozenLakeExpert()


class MinesweeperEnv(TextArenaEnv):
    name = "textarena/Minesweeper"
    game = "Minesweeper"
    title = "Minesweeper: reveal every cell without a mine"
    description = "textarena's Minesweeper: reveal all safe cells of a 5x5 to 12x12 board."
    action_help = "[row col] to reveal a cell, e.g. [2 3]."
    max_steps = _limits(game)

    def expert(self) -> Expert:
        raise env_error(f"no scripted expert for {self.name}: play it with a model policy")


class SudokuEnv(TextArenaEnv):
    name = "textarena/Sudoku"
    game = "Sudoku"
    title = "Sudoku: fill the empty cells of the 9x9 grid"
    description = "textarena's Sudoku: fill a 9x9 grid given 75 down to 40 clues, one cell per move."
    action_help = "[row column number], rows and columns 1-9, e.g. [5 3 7]."
    max_steps = _limits(game)

    def expert(self) -> Expert:
        return SudokuExpert()
