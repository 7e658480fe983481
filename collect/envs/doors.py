"""`doors`: the easiest built-in env. Open the door the key is behind, room after room.

Difficulty 1 is a single step (three doors, the text says where the key is); higher levels add doors, hide
the answer on a sign that must be read first, and chain rooms, so the agent has to keep going.
"""

from __future__ import annotations

import random
import re

from trajlake.collect.envs.base import Env, Expert, InvalidAction, parse
from trajlake.schemas.records import Task

COLORS = ("red", "green", "blue", "white", "black", "yellow", "pink", "brown", "gray", "purple", "orange")
COUNT = {3: "Three", 4: "Four", 5: "Five"}
#: difficulty -> (rooms, doors per room, the key's door is on a sign); expert turns: 1, 2, 4, 6
LEVELS = {1: (1, 3, False), 2: (1, 4, True), 3: (2, 4, True), 4: (3, 5, True)}
KEY_RE = re.compile(r"key is behind the (\w+) door")
DOORS_RE = re.compile(r"\w+ doors: ([\w, ]+)\.")


class DoorsEnv(Env):
    """Pick the right door. Actions: "open <color>", and "read sign" where a sign is."""

    name = "doors"
    description = "Open the door the key is behind; harder levels hide it on a sign and chain rooms."
    action_help = "open <color>, read sign."
    max_steps = {1: 3, 2: 4, 3: 7, 4: 10}

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        n_rooms, n_doors, sign = LEVELS[difficulty]
        rooms = []
        for _ in range(n_rooms):
            doors = rng.sample(COLORS, n_doors)
            rooms.append({"doors": doors, "key": rng.choice(doors), "sign": sign})
        if n_rooms == 1:
            instruction = "Open the door with the key."
        else:
            instruction = f"Pass {n_rooms} rooms. In each room, open the door with the key."
        optimal = n_rooms * (2 if sign else 1)
        return instruction, {"rooms": rooms}, {"optimal_steps": optimal}

    def _start(self, task: Task) -> str:
        self.rooms = task.ground_truth["rooms"]
        self.room = 0
        return self._describe()

    def _describe(self) -> str:
        r = self.rooms[self.room]
        text = f"{COUNT[len(r['doors'])]} doors: {', '.join(r['doors'])}."
        text += " A sign is here." if r["sign"] else f" The key is behind the {r['key']} door."
        if len(self.rooms) > 1:
            text = f"Room {self.room + 1} of {len(self.rooms)}. {text}"
        return text

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        verb, arg = parse(action, ("open", "read"))
        r = self.rooms[self.room]
        if verb == "read":
            if not r["sign"]:
                raise InvalidAction("There is no sign here.")
            if arg != "sign":
                raise InvalidAction("Only the sign can be read.")
            return f"The sign says: the key is behind the {r['key']} door.", 0.0, False, {}
        color = re.sub(r" door$", "", arg)
        if color not in r["doors"]:
            raise InvalidAction(f"No such door. Doors: {', '.join(r['doors'])}.")
        if color != r["key"]:
            return f"The {color} door has no key. You lose.", 0.0, True, {"success": False}
        self.room += 1
        if self.room == len(self.rooms):
            return f"You open the {color} door and find the key. You win!", 1.0, True, {"success": True}
        return f"You open the {color} door and find a key.\n{self._describe()}", 0.0, False, {}

    def progress(self) -> float:
        """The share of rooms passed."""
        return self.room / len(self.rooms)

    def expert(self) -> Expert:
        return DoorsExpert()


class DoorsExpert(Expert):
    """Opens the door the observation names; reads the sign when the observation does not name one."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.doors: list[str] = []  # the doors of the room the player is in, and whether it has a sign
        self.sign = False

    def _see(self, observation: str) -> None:
        """Remember the room the observation describes (a reply to "read sign" describes none: keep the last)."""
        rooms = list(DOORS_RE.finditer(observation))
        if rooms:
            self.doors = rooms[-1].group(1).split(", ")
            self.sign = "sign is here" in observation[rooms[-1].end():]

    def act(self, observation: str) -> str:
        self._see(observation)
        named = KEY_RE.findall(observation)
        if named:
            return f"open {named[-1]}"
        if "sign is here" in observation:
            return "read sign"
        # Only reached on an observation the env never sends; fall back on the oracle's first room.
        return f"open {self.task.ground_truth['rooms'][0]['key']}"

    def guess(self, observation: str, rng: random.Random) -> str | None:
        """Where a sign hides the key, the hasty demonstrator opens one of the listed doors without reading it."""
        doors = DOORS_RE.findall(observation)
        if KEY_RE.search(observation) or "sign is here" not in observation or not doors:
            return None
        return f"open {rng.choice(doors[-1].split(', '))}"

    def valid_actions(self, observation: str) -> list[str]:
        """Opening any door of the room (a wrong one loses, but the env accepts it), and reading its sign."""
        self._see(observation)
        return [f"open {d}" for d in self.doors] + (["read sign"] if self.sign else [])
