"""`crafting`: a TextCraft-like env. Get base items and craft up a recipe tree to the goal item.

Each task draws its own recipe tree (names from a small fixed vocabulary), so the agent must read the
recipes rather than memorise them. Difficulty is the tree's depth; from difficulty 2 on, distractor recipes
that do not lead to the goal are mixed in, and from 3 on side branches need crafting too.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from trajlake.collect.envs.base import Env, Expert, InvalidAction, parse
from trajlake.schemas.records import Task

BASE = ("wood", "stone", "iron", "gold", "coal", "sand", "clay", "wool", "string", "water", "wheat", "flint")
CRAFTED = ("plank", "stick", "torch", "pickaxe", "sword", "table", "chest", "glass", "brick", "bowl", "door",
           "box", "bed", "axe", "shield", "lamp", "wheel", "cart", "bread", "rope", "bucket", "bow", "arrow", "boat")
# Expert turns at most 3, 5, 9, 13 (gets + crafts of the tree); the limits leave room for a few slips.
MAX_STEPS = {1: 6, 2: 9, 3: 14, 4: 20}
INV_RE = re.compile(r"Inventory: (.*)")


def show_inventory(inv: Counter) -> str:
    """ "coal, wood x2" (sorted), or "empty"."""
    items = [f"{k} x{v}" if v > 1 else k for k, v in sorted(inv.items()) if v > 0]
    return ", ".join(items) or "empty"


def parse_inventory(text: str) -> Counter:
    """The inverse of `show_inventory`."""
    inv: Counter = Counter()
    for part in text.strip().rstrip(".").split(", "):
        name, _, count = part.partition(" x")
        if name and name != "empty":
            inv[name] += int(count) if count.isdigit() else 1
    return inv


class CraftingEnv(Env):
    """Recipe planning. Actions: "get <base item>", "craft <item>", "inventory"."""

    name = "crafting"
    description = "Craft a goal item from listed recipes, getting base items first (recipe depth 1 to 4)."
    action_help = "get <base item>, craft <item>, inventory."
    max_steps = MAX_STEPS

    def _generate(self, rng: random.Random, difficulty: int) -> tuple[str, dict, dict]:
        names = rng.sample(CRAFTED, len(CRAFTED))
        recipes: dict[str, list[str]] = {}

        def build(depth: int) -> str:
            item = names.pop()
            if depth == 1:
                recipes[item] = rng.sample(BASE, 2)
                return item
            side = build(1) if depth >= 3 and rng.random() < 0.5 else rng.choice(BASE)
            recipes[item] = rng.sample([build(depth - 1), side], 2)  # random order of the two ingredients
            return item

        goal = build(difficulty)
        optimal = len(plan(goal, recipes, Counter()))
        for _ in range(difficulty - 1):  # distractors: plausible recipes that lead nowhere
            recipes[names.pop()] = rng.sample(BASE, 2)
        order = rng.sample(sorted(recipes), len(recipes))
        truth = {"goal": goal, "recipes": [[item, recipes[item]] for item in order]}
        return f"Goal: craft {goal}.", truth, {"optimal_steps": optimal}

    def _start(self, task: Task) -> str:
        self.goal = task.ground_truth["goal"]
        self.recipes = {item: list(ings) for item, ings in task.ground_truth["recipes"]}
        self.base = sorted({i for ings in self.recipes.values() for i in ings} - set(self.recipes))
        self.inv: Counter = Counter()
        self.crafted: set[str] = set()
        lines = ["Recipes:"] + [f"{item} = {' + '.join(ings)}" for item, ings in task.ground_truth["recipes"]]
        lines += [f"Base items: {', '.join(self.base)}.", "Inventory: empty."]
        return "\n".join(lines)

    def _act(self, action: str) -> tuple[str, float, bool, dict]:
        if action in ("inventory", "check inventory", "look"):
            return f"Inventory: {show_inventory(self.inv)}.", 0.0, False, {}
        verb, item = parse(action, ("get", "craft", "inventory"))
        if verb == "get":
            if item in self.recipes:
                raise InvalidAction(f"You cannot get {item}; craft it.")
            if item not in self.base:
                raise InvalidAction(f"Base items: {', '.join(self.base)}.")
            self.inv[item] += 1
            return f"Got {item}.\nInventory: {show_inventory(self.inv)}.", 0.0, False, {}
        if verb != "craft" or item not in self.recipes:
            raise InvalidAction(f"No recipe for {item[:30]}." if verb == "craft" else "Unknown action.")
        missing = Counter(self.recipes[item]) - self.inv
        if missing:
            return (f"Cannot craft {item}. Missing: {show_inventory(missing)}.\n"
                    f"Inventory: {show_inventory(self.inv)}."), 0.0, False, {"missing": sorted(missing)}
        self.inv -= Counter(self.recipes[item])
        self.inv[item] += 1
        self.crafted.add(item)
        if item == self.goal:
            return f"Crafted {item}. You win!", 1.0, True, {"success": True}
        return f"Crafted {item}.\nInventory: {show_inventory(self.inv)}.", 0.0, False, {}

    def progress(self) -> float:
        """The share of the goal's recipe tree (crafted items) crafted at least once."""
        tree = {a.split(" ", 1)[1] for a in plan(self.goal, self.recipes, Counter()) if a.startswith("craft")}
        return len(tree & self.crafted) / len(tree)

    def expert(self) -> Expert:
        return CraftingExpert()


def plan(item: str, recipes: dict[str, list[str]], inv: Counter) -> list[str]:
    """The shortest action list that adds `item` to `inv`, using what `inv` holds (consumed as planned)."""
    if inv[item] > 0:
        inv[item] -= 1
        return []
    if item not in recipes:
        return [f"get {item}"]
    return [a for ing in recipes[item] for a in plan(ing, recipes, inv)] + [f"craft {item}"]


class CraftingExpert(Expert):
    """Replans from the inventory in each observation, so it recovers from any detour."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.recipes = {item: list(ings) for item, ings in task.ground_truth["recipes"]}
        # the base items the first observation lists: every ingredient no recipe makes
        self.base = sorted({i for ings in self.recipes.values() for i in ings} - set(self.recipes))
        self.inv: Counter = Counter()

    def act(self, observation: str) -> str:
        found = INV_RE.findall(observation)
        if found:  # every observation but a bare invalid-action note reports the inventory
            self.inv = parse_inventory(found[-1])
        steps = plan(self.task.ground_truth["goal"], self.recipes, Counter(self.inv))
        return steps[0] if steps else "inventory"

    def valid_actions(self, observation: str) -> list[str]:
        """Getting any base item (a distractor's too), crafting any listed item whose ingredients are held,
        and looking at the inventory. A craft with an ingredient missing is left out: the env answers it
        without crafting anything, so it is no action a player who knows the inventory would take."""
        crafts = [f"craft {item}" for item, ings in self.recipes.items() if Counter(ings) <= self.inv]
        return [f"get {b}" for b in self.base] + crafts + ["inventory"]
