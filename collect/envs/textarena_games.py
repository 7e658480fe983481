"""textarena's single-player games as trajlake envs, with their experts (see thirdparty.py for the rules the
wrappers follow)."""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any, NamedTuple

from trajlake.collect.envs.base import Expert
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


# ---- textarena experts ----------------------------------------------------------------------------------


def hanoi_moves(n: int, source: str = "A", target: str = "C", spare: str = "B") -> list[tuple[str, str]]:
    """The 2^n - 1 moves that carry n disks from `source` to `target`."""
    if n == 0:
        return []
    return hanoi_moves(n - 1, source, spare, target) + [(source, target)] + hanoi_moves(n - 1, spare, target, source)


_TOWER_RE = re.compile(r"^([ABC]): \[([\d, ]*)\]", re.MULTILINE)


def _hanoi_board(text: str) -> dict[str, list[int]] | None:
    """The last board in `text`: tower -> its disks, bottom first; None where there is none."""
    if "Current Board:" not in text:
        return None
    towers = {t: [int(d) for d in disks.split(",") if d.strip()]
              for t, disks in _TOWER_RE.findall(text.rsplit("Current Board:", 1)[1])}
    return towers if len(towers) == 3 else None


def _hanoi_next(towers: dict[str, list[int]], n: int, target: str = "C") -> tuple[str, str] | None:
    """The first move of the shortest way from `towers` to disks 1..n on `target`; None where they are there:
    the biggest disk not yet on `target` goes there once everything smaller is on the third tower."""
    where = {d: t for t, disks in towers.items() for d in disks}
    while n and where.get(n) == target:
        n -= 1
    if not n:
        return None
    spare = ({"A", "B", "C"} - {where[n], target}).pop()
    return _hanoi_next(towers, n - 1, spare) or (where[n], target)


class HanoiExpert(Expert):
    """The recursive solution, one move per turn (an invalid move in between changes nothing); once a noisy
    demonstrator's move has left it, the shortest way from the board shown."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.disks = int(task.ground_truth["num_disks"])
        self.moves = deque(hanoi_moves(self.disks))
        self.towers: dict[str, list[int]] | None = None
        self.off_plan = False

    def act(self, observation: str) -> str:
        self.towers = _hanoi_board(observation) or self.towers
        move = _hanoi_next(self.towers, self.disks) if self.off_plan and self.towers else None
        source, target = move or (self.moves.popleft() if self.moves else ("A", "C"))
        return f"[{source} {target}]"

    def valid_actions(self, observation: str) -> list[str]:
        """Every legal move on the board last shown: a top disk onto an empty tower or a bigger disk."""
        towers = _hanoi_board(observation) or self.towers or {}
        return [f"[{s} {t}]" for s, a in sorted(towers.items()) for t, b in sorted(towers.items())
                if s != t and a and (not b or b[-1] > a[-1])]

    def overruled(self, action: str) -> None:
        """The recursive plan no longer fits the board: play the shortest way from each board shown."""
        self.off_plan = True


_HINT_RE = re.compile(r"The target number is (higher|lower)")


class GuessTheNumberExpert(Expert):
    """Binary search on the game's "higher"/"lower" hints (it never reads the secret)."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.lo, self.hi = int(task.ground_truth["min_number"]), int(task.ground_truth["max_number"])
        self.low, self.high = self.lo, self.hi
        self.last: int | None = None
        self.guessed: set[int] = set()  # the game refuses a number guessed before

    def act(self, observation: str) -> str:
        hints = _HINT_RE.findall(observation)
        if self.last is not None:
            self.guessed.add(self.last)
        if hints and self.last is not None:
            if hints[-1] == "higher":
                self.lo = max(self.lo, self.last + 1)
            else:
                self.hi = min(self.hi, self.last - 1)
        self.last = (self.lo + self.hi) // 2
        return f"[{self.last}]"

    def valid_actions(self, observation: str) -> list[str]:
        """Every number of the range not guessed yet (one the hints ruled out too: wasted, but accepted)."""
        return [f"[{n}]" for n in range(self.low, self.high + 1) if n not in self.guessed]

    def overruled(self, action: str) -> None:
        """The next hint answers `action`'s number, not the expert's."""
        number = re.search(r"\d+", action)
        self.last = int(number.group()) if number else None


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

    def valid_actions(self, observation: str) -> list[str]:
        """Every move that stays on the board (into a hole too: it loses, but the game accepts it); the expert
        finds its path again from each board shown."""
        start = next(((r, c) for r, row in enumerate(self.grid) for c, v in enumerate(row) if v.startswith("P")),
                     None)
        if start is None:
            return []
        return [f"[{m}]" for m, (dr, dc) in _MOVES.items()
                if 0 <= start[0] + dr < len(self.grid) and 0 <= start[1] + dc < len(self.grid[0])]


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
        self.filled: tuple[int, int] | None = None  # the cell `act` just filled in `board`

    def act(self, observation: str) -> str:
        board = _parse_sudoku(observation)
        self.filled = None
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
                    self.board[r][c], self.filled = self.solution[r][c], (r, c)
                    return f"[{r + 1} {c + 1} {self.solution[r][c]}]"
        return "[1 1 1]"

    def valid_actions(self, observation: str) -> list[str]:
        """Each empty cell of the board shown, filled with its solution digit: the game refuses any other digit
        (it checks moves against its own solution), so a noisy demonstrator can only change the order."""
        if self.board is None or self.solution is None:
            return []
        board = [row[:] for row in self.board]
        if self.filled is not None:
            board[self.filled[0]][self.filled[1]] = 0
        return [f"[{r + 1} {c + 1} {self.solution[r][c]}]" for r in range(9) for c in range(9) if not board[r][c]]

    def overruled(self, action: str) -> None:
        """The cell `act` meant to fill is still empty."""
        if self.filled is not None:
            self.board[self.filled[0]][self.filled[1]] = 0
            self.filled = None


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
