"""`maze`: walk a grid maze to the goal, seeing only your position, the open directions and the goal.

Cells are (x, y) with x growing east and y growing south. The maze is a random spanning tree of the grid
(so every cell is reachable) plus a share of the remaining passages: all of them at difficulty 1 (an open
room, where walking toward the goal is optimal), none at difficulty 4 (a perfect maze with dead ends).
"""

from __future__ import annotations

import random
import re
from collections import deque

from trajlake.collect.envs.base import Env, Expert, InvalidAction, parse
from trajlake.schemas.records import Task

#: direction -> (bit in a cell's hex digit, dx, dy)
DIRS = {"north": (1, 0, -1), "east": (2, 1, 0), "south": (4, 0, 1), "west": (8, -1, 0)}
#: difficulty -> (grid size, share of non-tree passages kept open, least start-goal distance)
LEVELS = {1: (3, 1.0, 2), 2: (4, 0.6, 3), 3: (5, 0.3, 4), 4: (6, 0.0, 5)}
POS_RE = re.compile(r"You are at \((\d+), (\d+)\)")
OPEN_RE = re.compile(r"Open: ([a-z, ]+)\.")


def _open_dirs(grid: list[str], x: int, y: int) -> list[str]:
    cell = int(grid[y][x], 16)
    return [d for d, (bit, _, _) in DIRS.items() if cell & bit]


def _distances(grid: list[str], src: tuple[int, int]) -> dict[tuple[int, int], tuple[int, str | None]]:
    """BFS from `src`: cell -> (distance, first move from `src` on a shortest path)."""
    seen = {src: (0, None)}
    queue = deque([src])
    while queue:
        x, y = queue.popleft()
        dist, first = seen[(x, y)]
        for d in _open_dirs(grid, x, y):
            nxt = (x + DIRS[d][1], y + DIRS[d][2])
            if nxt not in seen:
                seen[nxt] = (dist + 1, first or d)
                queue.append(nxt)
    return seen


class MazeEnv(Env):
    """Grid navigation. Actions: "move north|south|east|west"."""

    name = "maze"
    description = "Walk a grid maze to the goal from local views (3x3 open room up to a 6x6 perfect maze)."
    action_help = "move north, move south, move east, move west."
    max_steps = {1: 8, 2: 20, 3: 30, 4: 50}

    def __init__(self, step_penalty: float = 0.0, invalid_penalty: float = 0.0):
        """`step_penalty` is subtracted from the reward of every move that does not reach the goal."""
        super().__init__(invalid_penalty=invalid_penalty)
        self.step_penalty = float(step_penalty)

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        size, keep, least = LEVELS[difficulty]
        cells = [[0] * size for _ in range(size)]

        def carve(x: int, y: int, d: str) -> None:
            bit, dx, dy = DIRS[d]
            cells[y][x] |= bit
            cells[y + dy][x + dx] |= {1: 4, 4: 1, 2: 8, 8: 2}[bit]  # the same passage seen from the other side

        # Randomised depth-first search carves a spanning tree: every cell reachable, no loops yet.
        stack, seen = [(0, 0)], {(0, 0)}
        while stack:
            x, y = stack[-1]
            nexts = [d for d, (_, dx, dy) in DIRS.items()
                     if 0 <= x + dx < size and 0 <= y + dy < size and (x + dx, y + dy) not in seen]
            if not nexts:
                stack.pop()
                continue
            d = rng.choice(nexts)
            carve(x, y, d)
            stack.append((x + DIRS[d][1], y + DIRS[d][2]))
            seen.add(stack[-1])
        # Then reopen a share of the other passages (loops make easier mazes).
        for y in range(size):
            for x in range(size):
                for d in ("east", "south"):
                    _, dx, dy = DIRS[d]
                    if x + dx < size and y + dy < size and rng.random() < keep:
                        carve(x, y, d)
        grid = ["".join(f"{c:x}" for c in row) for row in cells]
        start = (rng.randrange(size), rng.randrange(size))
        dist = _distances(grid, start)
        goal = rng.choice(sorted(c for c, (k, _) in dist.items() if k >= least))
        instruction = f"Reach the goal in a {size}x{size} maze. North is y-1, east is x+1."
        truth = {"size": size, "grid": grid, "start": list(start), "goal": list(goal)}
        return instruction, truth, {"optimal_steps": dist[goal][0]}

    def _start(self, task: Task) -> str:
        truth = task.ground_truth
        self.grid = list(truth["grid"])
        self.pos = tuple(truth["start"])
        self.goal = tuple(truth["goal"])
        # Distances to the goal (passages are two-way), for the partial score of a lost episode.
        self.to_goal = {c: k for c, (k, _) in _distances(self.grid, self.goal).items()}
        return self._describe()

    def _describe(self) -> str:
        x, y = self.pos
        return (f"You are at ({x}, {y}). Goal at ({self.goal[0]}, {self.goal[1]}). "
                f"Open: {', '.join(_open_dirs(self.grid, x, y))}.")

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        _, arg = parse(action, ("move", "go"))
        if arg not in DIRS:
            raise InvalidAction("Directions: north, south, east, west.")
        x, y = self.pos
        if arg not in _open_dirs(self.grid, x, y):
            text, info = f"Wall to the {arg}. {self._describe()}", {"hit_wall": True}
            return text, -self.step_penalty, False, info
        self.pos = (x + DIRS[arg][1], y + DIRS[arg][2])
        if self.pos == self.goal:
            return f"You reach the goal at ({self.goal[0]}, {self.goal[1]}). You win!", 1.0, True, {"success": True}
        return self._describe(), -self.step_penalty, False, {}

    def progress(self) -> float:
        """The share of the start's distance to the goal walked off."""
        return 1 - self.to_goal[self.pos] / self.to_goal[tuple(self.task.ground_truth["start"])]

    def expert(self) -> Expert:
        return MazeExpert()


class MazeExpert(Expert):
    """Breadth-first search on the task's full grid from the position the observation reports."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.grid = task.ground_truth["grid"]
        self.goal = tuple(task.ground_truth["goal"])

    def act(self, observation: str) -> str:
        found = POS_RE.findall(observation)
        pos = tuple(map(int, found[-1])) if found else tuple(self.task.ground_truth["start"])
        # A fresh search from wherever the observation says we are (at most 36 cells) stays right even
        # if the agent was driven off the expert's path.
        _, first = _distances(self.grid, pos)[self.goal]
        return f"move {first}"

    def valid_actions(self, observation: str) -> list[str]:
        """The moves through the open sides the observation lists (a wander; the expert walks back from wherever
        it ends up). A move into a wall is accepted too, but no one who reads "Open:" makes it; without that
        line, all four moves."""
        found = OPEN_RE.findall(observation)
        dirs = [d for d in found[-1].split(", ") if d in DIRS] if found else list(DIRS)
        return [f"move {d}" for d in dirs]
