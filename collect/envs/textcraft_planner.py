"""A scripted TextCraft player that plans only from what it is told: for AgentGym's real TextCraft server.

AgentGym's TextCraft shows, once, a list of crafting commands and a goal ("Goal: craft X."); afterwards the
player only hears replies to its own actions ("Got 2 oak logs", "Crafted 4 oak planks", "Could not find
planks"). Some listed commands are distractors, and some name a generic ingredient (a Minecraft tag such as
"planks" or "wool") that cannot be got: a specific kind ("oak planks", "black wool") made by another listed
command must be crafted and named instead. The player never sees the recipe tree or the answer, so this
expert works the way a careful human would:

* `parse_commands` reads the recipes and the goal; an item no listed command makes is a raw item to `get`.
* `plan` picks, for every item the goal needs, the cheapest way to have it (get it, craft it by one of its
  recipes, or, for a generic name, make a listed item whose name ends with it), then adds the quantities up
  over the whole tree (a shared intermediate is crafted once for all its uses, counts per craft are rounded
  up) minus what is already held, and lists the actions, ingredients before what they make.
* `TextCraftPlanner` keeps the inventory from the replies, learns from each failure (a name that cannot be
  got, a kind that does not fit a generic ingredient, a recipe the game refuses) and plans again every turn,
  so one wrong guess costs a step, not the episode.

It never imports nor copies the server's code; tests play it against the real server over HTTP.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from trajlake.collect.envs.base import Expert
from trajlake.schemas.records import Task

#: The action that is always valid and never hurts: also the answer when there is nothing sensible to do.
INVENTORY = "inventory"
_COMMAND = re.compile(r"^\s*craft (\d+) (.+?) using (.+?)\s*$", re.MULTILINE)
_INGREDIENT = re.compile(r"^(\d+) (.+)$")
_GOAL = re.compile(r"Goal: craft (.+?)\.?\s*$", re.MULTILINE)
_INVENTORY_ITEM = re.compile(r"\[([^\]]+)\] \((\d+)\)")
_INF = math.inf


@dataclass(frozen=True)
class Recipe:
    """One crafting command: one craft turns `inputs` (name, count per craft) into `count` of `output`."""

    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]

    def action(self, kinds: dict[str, str] | None = None) -> str:
        """The craft action, each generic ingredient replaced by the specific kind in `kinds` (name -> kind)."""
        kinds = kinds or {}
        used = ", ".join(f"{n} {kinds.get(name, name)}" for name, n in self.inputs)
        return f"craft {self.count} {self.output} using {used}"


def parse_commands(text: str) -> tuple[list[Recipe], str | None]:
    """The recipes and the goal in an observation; ([], None) where it has none. Unreadable lines are skipped."""
    recipes = []
    for m in _COMMAND.finditer(text or ""):
        inputs = [_INGREDIENT.match(part.strip()) for part in m.group(3).split(",")]
        if all(inputs):
            recipes.append(Recipe(m.group(2).strip(), int(m.group(1)),
                                  tuple((i.group(2).strip(), int(i.group(1))) for i in inputs)))
    goal = _GOAL.search(text or "")
    return recipes, (goal.group(1).strip() if goal else None)


def item_name(text: str) -> str:
    """An item as the commands name it: the game says "Crafted 4 minecraft:oak_planks" but lists "oak planks"."""
    return text.strip().removeprefix("minecraft:").replace("_", " ")


def parse_inventory(text: str) -> Counter | None:
    """The items in an "Inventory: [oak planks] (4) ..." reply; None when `text` is no inventory reply."""
    if not (text or "").lstrip().startswith("Inventory:"):
        return None
    return Counter({item_name(name): int(n) for name, n in _INVENTORY_ITEM.findall(text)})


@dataclass
class Knowledge:
    """What the player has learned in one episode beyond the listed commands (all from failed actions)."""

    ungettable: set[str] = field(default_factory=set)  # names `get` refused: craft them, or they are generic
    bad_kinds: set[tuple[str, str]] = field(default_factory=set)  # (generic, kind): the kind does not fit
    bad_recipes: set[Recipe] = field(default_factory=set)  # recipes the game refused as written


@dataclass(frozen=True)
class Step:
    """One planned action; for a craft, also its recipe and the kind used for each generic ingredient.
    `mistake`: played on purpose by a noisy demonstrator, so its failure teaches the planner nothing."""

    action: str
    recipe: Recipe | None = None
    kinds: tuple[tuple[str, str], ...] = ()
    mistake: bool = False

    def used(self) -> list[tuple[str, int]]:
        """The (item, count) a craft takes out of the inventory."""
        kinds = dict(self.kinds)
        return [(kinds.get(name, name), n) for name, n in self.recipe.inputs] if self.recipe else []


def plan(goal: str, recipes: Iterable[Recipe], inventory: Counter | dict | None = None,
         knowledge: Knowledge | None = None) -> list[str]:
    """The actions that craft `goal` from `inventory`, ingredients first; [] when no way is known."""
    return [s.action for s in plan_steps(goal, recipes, inventory, knowledge)]


def plan_steps(goal: str, recipes: Iterable[Recipe], inventory: Counter | dict | None = None,
               knowledge: Knowledge | None = None) -> list[Step]:
    """`plan`, with each craft's recipe and kinds.

    Ways to have an item: craft it by a listed recipe; `get` it when no listed command makes it (and `get`
    has not failed for it); or, for a name no command makes but some listed items end with (a generic
    ingredient like "planks"), make one of those kinds. The cheapest way (estimated steps) is chosen per item
    once, then quantities are summed over the chosen tree so that shared intermediates are made together.
    """
    return _Planner(list(recipes), knowledge or Knowledge()).steps(goal, Counter(inventory or {}))


class _Planner:
    """One planning pass: choose a way per item (cost-based, cycle-safe), then add up quantities."""

    def __init__(self, recipes: list[Recipe], knowledge: Knowledge):
        self.know = knowledge
        self.made_by: dict[str, list[Recipe]] = {}
        for r in sorted(recipes, key=Recipe.action):  # ties go the same way whatever the listing order
            if r not in knowledge.bad_recipes:
                self.made_by.setdefault(r.output, []).append(r)
        self.produced = {r.output for r in recipes}  # a refused recipe still shows its output is craftable
        self.choice: dict[str, Recipe | str] = {}  # item -> its recipe, "get", or (generic) the kind to make

    def kinds(self, name: str) -> list[str]:
        """Listed items that may stand for the generic ingredient `name` ("oak planks" for "planks")."""
        if name in self.produced:
            return []
        return sorted(k for k in self.produced if k.endswith(" " + name) and (name, k) not in self.know.bad_kinds)

    def cost(self, name: str, qty: int, path: frozenset = frozenset()) -> tuple[float, Recipe | str | None]:
        """(estimated steps to have `qty` of `name`, the cheapest way); inf where every way loops or is unknown.

        A name no command makes is made through its kinds when one works and got otherwise: a kind made from
        the name itself ("mossy cobblestone" for "cobblestone") loops, so a raw item still ends up got.
        """
        if name in path:
            return _INF, None
        path = path | {name}
        best: tuple[float, Recipe | str | None] = (_INF, None)
        for recipe in self.made_by.get(name, []):
            crafts = -(-qty // recipe.count)
            steps = crafts + sum(self.cost(i, crafts * n, path)[0] for i, n in recipe.inputs)
            best = min(best, (steps, recipe), key=lambda b: b[0])
        for kind in self.kinds(name):
            best = min(best, (self.cost(kind, qty, path)[0], kind), key=lambda b: b[0])
        if best[0] == _INF and name not in self.produced and name not in self.know.ungettable:
            best = (1.0, "get")
        return best

    def choose(self, name: str, qty: int) -> bool:
        """Fix a way for `name` and everything below it; False when some needed item cannot be had."""
        if name in self.choice:
            return True
        steps, way = self.cost(name, qty)
        if steps == _INF:
            return False
        self.choice[name] = way
        if isinstance(way, Recipe):
            crafts = -(-qty // way.count)
            return all(self.choose(i, crafts * n) for i, n in way.inputs)
        return way == "get" or self.choose(way, qty)

    @staticmethod
    def is_kind(way: Recipe | str) -> bool:
        """Whether a chosen way is a kind standing for a generic ingredient."""
        return isinstance(way, str) and way != "get"

    def below(self, name: str) -> list[str]:
        """What the chosen way for `name` is made from."""
        way = self.choice[name]
        return [i for i, _ in way.inputs] if isinstance(way, Recipe) else [] if way == "get" else [way]

    def order(self, name: str, seen: list[str]) -> list[str]:
        """Items below and including `name`, each after everything it is made from."""
        if name not in seen:
            for sub in self.below(name):
                self.order(sub, seen)
            seen.append(name)
        return seen

    def steps(self, goal: str, inventory: Counter) -> list[Step]:
        if not self.choose(goal, 1):
            return []
        order = self.order(goal, [])
        need = Counter({goal: 1})
        runs: dict[str, list[Step]] = {}
        for name in reversed(order):  # the goal first: an item's need is known before its ingredients'
            missing = need[name] - inventory[name]
            if missing <= 0:
                continue
            way = self.choice[name]
            if way == "get":
                runs[name] = [Step(f"get {missing} {name}")]
            elif isinstance(way, Recipe):
                crafts = -(-missing // way.count)
                for i, n in way.inputs:
                    need[i] += crafts * n
                kinds = {i: self.choice[i] for i, _ in way.inputs if self.is_kind(self.choice[i])}
                runs[name] = [Step(way.action(kinds), way, tuple(sorted(kinds.items())))] * crafts
            else:
                need[way] += missing
        return [s for name in order for s in runs.get(name, [])]


class TextCraftPlanner(Expert):
    """Plays AgentGym's TextCraft from its observations alone (never the task's ground truth).

    `reset(task)` starts an episode; `act(observation)` answers each observation (first the one with the
    crafting commands and the goal, then the replies to its actions) with one action string. It re-plans
    every turn from the inventory it has tracked and what its failed actions taught it; with no commands to
    plan from, or when its inventory may be wrong, it answers "inventory".
    """

    def __init__(self) -> None:
        self.task: Task | None = None
        self._start()

    def reset(self, task: Task | None) -> None:
        """Start a new episode (the task is only kept; its ground truth, if any, is never read)."""
        super().reset(task)
        self._start()

    def _start(self) -> None:
        self.recipes: list[Recipe] = []
        self.goal: str | None = None
        self.inventory: Counter = Counter()
        self.knowledge = Knowledge()
        self.last: Step | None = None  # the previous action, to read its reply
        self.failures: Counter = Counter()  # action -> times refused
        self.check_inventory = False
        self.checking = False  # the last action was that look
        self.got: set[str] = set()  # names `get` gave: raw items for sure

    def act(self, observation: str) -> str:
        """The next action for `observation`; never raises."""
        observation = observation if isinstance(observation, str) else str(observation or "")
        recipes, goal = parse_commands(observation)
        if recipes and goal and (recipes, goal) != (self.recipes, self.goal):
            self._start()  # the first observation of an episode (also when reset was not called)
            self.recipes, self.goal = recipes, goal
        elif self.last is not None:
            self._learn(observation.strip())
        self.last = self._next()
        return self.last.action

    def plan(self) -> list[str]:
        """The actions the planner means to take from now on ([] when it knows no way to the goal)."""
        return [s.action for s in self._plan()]

    def _plan(self) -> list[Step]:
        if not (self.recipes and self.goal):
            return []
        return plan_steps(self.goal, self.recipes, self.inventory, self.knowledge)

    def _next(self) -> Step:
        self.checking, self.check_inventory = self.check_inventory, False
        if self.checking:
            return Step(INVENTORY)
        steps = self._plan()
        return steps[0] if steps else Step(INVENTORY)

    def _learn(self, text: str) -> None:
        """Update the inventory and the knowledge from the reply to the previous action."""
        last = self.last
        held = parse_inventory(text)
        if held is not None:
            self.inventory = held
        elif m := re.match(r"Got (\d+) (.+?)\s*$", text):
            self.inventory[item_name(m.group(2))] += int(m.group(1))
            self.got.add(item_name(m.group(2)))
        elif m := re.match(r"Crafted (\d+) (.+?)\s*$", text):
            for name, n in last.used():  # (a recipe may name one item twice)
                self.inventory[name] -= n
            self.inventory[item_name(m.group(2))] += int(m.group(1))
            self.inventory = +self.inventory  # drop what is used up
        elif last.action != INVENTORY and not last.mistake:
            self._failed(last, text)

    def _failed(self, last: Step, text: str) -> None:
        """Blame a refused action on what it assumed, so that the next plan avoids it."""
        self.failures[last.action] += 1
        if last.action.startswith("get "):
            self.knowledge.ungettable.add(last.action.split(" ", 2)[2])  # made only by crafting, or generic
        elif last.recipe is None:
            return
        elif text.startswith("Could not find enough items") and self.failures[last.action] < 2:
            self.check_inventory = True  # the tracked inventory may be wrong: look, then try once more
        elif text.startswith("Could not find a valid recipe") and last.kinds:
            self.knowledge.bad_kinds.update(last.kinds)  # a kind that does not count as the generic
        else:
            self.knowledge.bad_recipes.add(last.recipe)

    # ---- a noisy demonstrator's mistakes (collect.policies.scripted) ----------------------------------

    def guess(self, observation: str, rng: random.Random) -> str | None:
        """The hasty player's mistake: craft the goal right away with its listed command, before gathering
        its ingredients (the game refuses it: "Could not find enough items"). None where the ingredients are
        held (that craft is the plan's next step) or no listed command makes the goal; asked after `act` read
        `observation`."""
        ways = sorted((r for r in self.recipes if r.output == self.goal), key=Recipe.action)
        if not ways:
            return None
        recipe = ways[rng.randrange(len(ways))]
        return None if self._holds(self._craft(recipe)) else recipe.action()

    def valid_actions(self, observation: str) -> list[str]:
        """What the game accepts now as far as the planner knows: "inventory"; `get` of each raw item it has
        got before or means to get (as many as its plan gets, else 1); and each listed craft, distractors
        too, whose ingredients it holds (a generic ingredient named by a held kind that has not failed for
        it). Asked after `act` read `observation`."""
        return list(self._options())

    def overruled(self, action: str) -> None:
        """`action` was played instead of the planned one: read its reply as the answer to it, and learn
        nothing from its failure (a mistake made on purpose says nothing about the recipes)."""
        self.check_inventory = self.checking  # a look at the inventory the planner wanted: put off a turn
        step = self._options().get(action)
        if step is None:
            recipes, _ = parse_commands(action)
            step = Step(action, recipes[0] if recipes else None)
        self.last = Step(step.action, step.recipe, step.kinds, mistake=True)

    def _options(self) -> dict[str, Step]:
        """`valid_actions`, each with its step (a craft's recipe and kinds, to read the reply by)."""
        out = {INVENTORY: Step(INVENTORY)}
        planned = self._plan()
        gets = {s.action.split(" ", 2)[2]: s.action for s in planned if s.action.startswith("get ")}
        for name in sorted(self.got | set(gets)):
            action = gets.get(name, f"get 1 {name}")
            out[action] = Step(action)
        crafts = [s for s in planned if s.recipe is not None]
        crafts += [self._craft(r, planned) for r in sorted(set(self.recipes) - self.knowledge.bad_recipes,
                                                           key=Recipe.action)]
        for step in crafts:
            if self._holds(step):
                out.setdefault(step.action, step)
        return out

    def _craft(self, recipe: Recipe, planned: list[Step] | None = None) -> Step | None:
        """The craft step of `recipe`, each ingredient known to be generic (`get` refused it, or the plan names a
        kind for it) named by a held kind that has not failed for it; None where one has no such kind. Any
        other name stays as listed: "blackstone" may be raw, and "polished blackstone" no kind of it."""
        generic = self.knowledge.ungettable | {g for s in planned or self._plan() for g, _ in s.kinds}
        bad = self.knowledge.bad_kinds
        kinds = {}
        for name, _ in recipe.inputs:
            if name in generic and not self.inventory[name]:
                held = sorted(k for k in self.inventory if k.endswith(" " + name) and (name, k) not in bad
                              and k != recipe.output)
                if not held:
                    return None
                kinds[name] = held[0]
        return Step(recipe.action(kinds), recipe, tuple(sorted(kinds.items())))

    def _holds(self, step: Step | None) -> bool:
        """Whether the tracked inventory holds everything the craft `step` uses (a recipe may name one item
        twice)."""
        if step is None:
            return False
        used: Counter = Counter()
        for name, n in step.used():
            used[name] += n
        return used <= self.inventory
