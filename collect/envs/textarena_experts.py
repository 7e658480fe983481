"""The scripted experts of textarena's single-player games (textarena_games.py): each reads the game's board
from the observation text and answers the move that solves it (Hanoi's recursion, a bisection, a shortest path
on the frozen lake, a backtracking sudoku solver)."""

from __future__ import annotations

import re
from collections import deque

from trajlake.collect.envs.base import Expert
from trajlake.schemas.records import Task


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
