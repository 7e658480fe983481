"""How one AgentGym env server speaks: the `Preset` record, its success rules and action clean-ups.

AgentGym's servers share a route scheme (/create, /reset, /step, /observation, /close) but disagree on nearly
every detail: whether /create takes a JSON body, the instance id's field name, how /reset names a task, which
key carries the observation, whether a score comes back and on what scale, whether /close exists, and above all
what a win is. A `Preset` writes those details down for one environment; `agentgym_presets.PRESETS` holds one
per environment, read off AgentGym's own client and server for it (../shared/agentgym).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Data-index splits of a server that lists no tasks and whose data size is unknown (its tasks are seeds): split ->
#: (first index, end index or None). The test split comes first because AgentGym's published evaluation sets are
#: the low indices; train starts past val and has no end.
DEFAULT_SPLITS: dict[str, tuple[int, int | None]] = {"test": (0, 100), "val": (100, 200), "train": (200, None)}

#: The split scheme of a server whose data has a size (the default there): its data indices are dealt to the
#: splits by a seeded permutation stratified by difficulty (`deal_splits`), so every split is drawn from one
#: distribution. The version names the algorithm and its seed (`STRATIFIED_SEED`): changing either is a new name
#: (the splits also depend on the preset's name, split sizes and difficulty profile).
STRATIFIED = "stratified-v1"
#: Each split is its contiguous range of `Preset.splits`: how trajlake split before STRATIFIED, and so the scheme
#: of a stored task whose meta names none (old lakes); also AgentGym's published evaluation sets (the low
#: indices). The only scheme of a server without a size (its tasks are seeds, its train split has no end).
CONTIGUOUS = "contiguous"
SPLIT_SCHEMES = (STRATIFIED, CONTIGUOUS)
STRATIFIED_SEED = 0
#: Tasks a split without an end gives when no `n` is asked for.
UNBOUNDED_N = 100


def bounded_splits(size: int, test: int = 100, val: int = 100) -> dict[str, tuple[int, int]]:
    """Disjoint splits of a server holding `size` tasks (data indices 0..size-1): test first, then val, train the
    rest, each ending where the next begins and train at `size`, so no index is ever asked past the data (a
    server that wraps its index, as TextCraft's does, would hand a train episode a test goal). These ranges are
    the CONTIGUOUS scheme, and their lengths every scheme's split sizes."""
    if size <= test + val:
        raise ValueError(f"a server of {size} tasks is too small for {test} test and {val} val tasks and a train split")
    return {"test": (0, test), "val": (test, test + val), "train": (test + val, size)}


def seeded_key(seed: int, salt: str, index: int) -> bytes:
    """A random-looking sort key of data index `index`: sorting by it is a seeded permutation. sha256, not
    `random`, so that the splits are the same on every machine and every Python version."""
    return hashlib.sha256(f"{seed}/{salt}/{index}".encode()).digest()


def deal_splits(strata: Sequence[int], sizes: Mapping[str, int], seed: int, salt: str = "") -> tuple[str, ...]:
    """The split of each data index (`labels[i]`), exactly `sizes[s]` indices to split s, stratified by `strata`.

    The indices are ordered by (stratum, seeded key), and the labels dealt along that order, each position to the
    split furthest behind its share of the positions so far ((p + 1) * size / N minus its count; ties to the
    split named first in `sizes`). Every prefix of that order then holds each split's share to within one, so
    every stratum (a run of the order, the difference of two prefixes) holds it to within two, usually one;
    which indices of a stratum go where is the seeded key's choice. A split never runs a whole task past its
    share, so the last position leaves every split its exact size.
    """
    n = len(strata)
    if sum(sizes.values()) != n:
        raise ValueError(f"split sizes {dict(sizes)} add up to {sum(sizes.values())}, not the {n} tasks to deal")
    order = sorted(range(n), key=lambda i: (strata[i], seeded_key(seed, salt, i)))
    counts = dict.fromkeys(sizes, 0)
    labels = [""] * n
    for p, i in enumerate(order):
        # the deficit times n, in integers: no rounding decides a tie
        split = max(sizes, key=lambda s: (p + 1) * sizes[s] - counts[s] * n)
        counts[split] += 1
        labels[i] = split
    return tuple(labels)


def expand_profile(profile: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The difficulty of each data index from a profile of runs ((difficulty, count), ...) in the server's order."""
    return tuple(d for d, count in profile for _ in range(count))


def index_strata(size: int, profile: Sequence[tuple[int, int]] | None) -> tuple[int, ...]:
    """What the stratified scheme stratifies by: each index's difficulty where the preset knows it, else its
    decile in the server's order, so that whatever the server's order means (easy first, by topic, by source),
    each split holds its share of every part of it."""
    return expand_profile(profile) if profile else tuple(i * 10 // size for i in range(size))


@functools.cache
def _stratified_labels(name: str, sizes: tuple[tuple[str, int], ...],
                       profile: tuple[tuple[int, int], ...] | None) -> tuple[str, ...]:
    """STRATIFIED's split of each data index of preset `name` (cached: presets are frozen)."""
    size = sum(n for _, n in sizes)
    return deal_splits(index_strata(size, profile), dict(sizes), STRATIFIED_SEED, name)


@functools.cache
def _stratified_order(name: str, sizes: tuple[tuple[str, int], ...],
                      profile: tuple[tuple[int, int], ...] | None) -> dict[str, tuple[int, ...]]:
    """STRATIFIED's splits as their data indices in task order: a second seeded permutation, so that the first n
    tasks of a split are a random sample of it (not its easiest stratum)."""
    labels = _stratified_labels(name, sizes, profile)
    members: dict[str, list[int]] = {s: [] for s, _ in sizes}
    for i, split in enumerate(labels):
        members[split].append(i)
    return {s: tuple(sorted(idx, key=lambda i: seeded_key(STRATIFIED_SEED, f"{name}/order", i)))
            for s, idx in members.items()}


@dataclass(frozen=True)
class StepReply:
    """One step's reply, read: what a success rule sees."""

    reward: float
    done: bool
    score: float | None  # the reply's score divided by the preset's score_scale, None when it sends none
    observation: str


def win_reward_at_least_one(r: StepReply) -> bool:
    """A win is a finished step rewarded 1 (TextCraft: the goal item crafted; maze: the goal reached, while the
    step limit ends the game at -1; wordle: the word guessed; ALFWorld: `won`; SQLGym: the right result set),
    or, where the server's reward is the progress so far (the tool envs: the client stores its increase as
    the step reward and the progress as the score), full progress."""
    value = r.score if r.score is not None else r.reward
    return r.done and value >= 1.0 - 1e-9


def win_positive_score(r: StepReply) -> bool:
    """A win is a finished episode with a positive score. BabyAI scores a win 1 - 0.9 * steps / max_steps, never
    exactly 1 (its server ends the episode only when that is above 0.5), so `reward == 1` would call every
    BabyAI win a loss."""
    value = r.score if r.score is not None else r.reward
    return r.done and value > 0.0


def win_full_score(r: StepReply) -> bool:
    """A win is a finished episode whose score is full: SciWorld 100 of 100 (a failed task scores -100), WebShop
    a purchase matching every attribute, option and the price (partial matches score in (0, 1))."""
    value = r.score if r.score is not None else r.reward
    return r.done and value >= 1.0 - 1e-9


_NOT_ALNUM = re.compile(r"[^A-Za-z0-9, ]+")


def keep_alnum_comma_space(action: str) -> str:
    """TextCraft's and BabyAI's clients send only letters, digits, commas and spaces, single-spaced."""
    return " ".join(_NOT_ALNUM.sub("", action).split())


def strip_spaces(action: str) -> str:
    return action.strip()


def first_line(action: str) -> str:
    """The action's first line: a reply that runs on after its action sends only the action."""
    return action.strip().split("\n", 1)[0].strip()


def first_line_alnum(action: str) -> str:
    """TextCraft's and BabyAI's clients: the first line after `Action:`, only letters, digits, commas, spaces."""
    return keep_alnum_comma_space(first_line(action))


_SQL_BLOCK = re.compile(r"```(?:sql)?\s*(.*?)\s*(?:```|$)", re.S | re.I)


def sql_from_block(action: str) -> str:
    """SQLGym's client: the statement inside a ```sql fence (the action itself when there is no fence)."""
    m = _SQL_BLOCK.search(action)
    return (m.group(1) if m else action).strip()


def tool_call_line(action: str) -> str:
    """The tool envs' servers read `Action: NAME with Action Input: {...}` from the reply's last line, prefix
    included: the action is sent on one line with its `Action:` prefix restored."""
    return "Action: " + " ".join(action.split())


@dataclass(frozen=True)
class Preset:
    """One AgentGym environment's protocol, prompt and idea of success.

    The env is registered as `agentgym/<name>`; a user gives only that name and the server's URL.
    """

    name: str
    """Short name, e.g. "textcraft" (the env is `agentgym/textcraft`)."""
    title: str
    """AgentGym's name, as its server greets (`GET /` says "This is environment TextCraft.")."""
    instructions: str
    """What the agent must do, in trajlake's words: the system prompt's first part."""
    action_help: str
    """The action grammar, e.g. "get N ITEM | craft N ITEM using N A, N B | inventory"."""
    success: Callable[[StepReply], bool]
    """Whether a step's reply ends the episode with a win, as this environment defines it."""
    prefix: str = ""
    """Route prefix: LMRL-Gym serves maze at /maze/create, ..."""
    create_body: dict[str, Any] | None = None
    """JSON body of POST /create; None sends none (TextCraft's /create requires one: `{}`)."""
    id_field: str = "id"
    """The instance id's field in requests: "id" or "env_idx"."""
    reset_field: str = "data_idx"
    """The task selector of /reset: data_idx, game, seed, session_id, item_id..."""
    reset_extra: tuple[tuple[str, Any], ...] = ()
    """Constant fields added to /reset (ALFWorld's world_type)."""
    obs_key: str = "observation"
    """The observation's key in /step replies (and /reset replies): "observation" or "state"."""
    first_observation: str = "reset"
    """Where the first observation comes from: the /reset reply ("reset"), or GET /observation after it
    ("observe": WebShop, SQLGym and the tool envs, whose /reset reply carries none)."""
    reset_prefix_key: str | None = None
    """A /reset reply field put before the first observation (SciWorld's task description)."""
    intro: str = ""
    """Text the environment's own client puts before the first observation (maze's rules and coordinates)."""
    create_task_field: str | None = None
    """The /create body field that carries the task's data index (the tool envs create per task: {"id": I})."""
    reset_suffix_key: str | None = None
    """A /reset reply list put after the first observation (ALFWorld's available_actions)."""
    word_list_route: str | None = None
    """A GET route whose list is put after the first observation (wordle's filtered_vocab)."""
    score_key: str | None = None
    """The reply key of a score (None: the server sends none)."""
    score_scale: float = 1.0
    """The score of a full success (SciWorld scores 0..100)."""
    cumulative_reward: bool = False
    """The server's reward is the progress so far, not this step's (the tool envs): the client stores its
    increase as the step reward, so that an episode's rewards add up to its final progress, and the progress
    itself as `score`."""
    can_close: bool = True
    """The server has POST /close; each episode's instance is then closed when it ends."""
    clean_action: Callable[[str], str] = strip_spaces
    """What the environment's own client does to an action before sending it."""
    invalid_prefixes: tuple[str, ...] = ()
    """Observations that mean the action was not carried out ("Could not ..."): such a step is stored with
    info.valid = false; other steps valid = true. Empty: validity unknown, and info has no `valid`."""
    expert: Callable[[], Any] | None = None
    """A scripted expert that plays from the observations alone (tasks of AgentGym servers carry no ground
    truth), for warm-start data and tests; None when there is none."""
    size: int | None = None
    """How many distinct tasks the server holds (data indices 0..size-1): TextCraft's 544 goals, which its server
    picks by index modulo 544, so index 544 is goal 0 again. None where the server's tasks are seeds or its data
    size is not known: its train split then has no end, and its only split scheme is CONTIGUOUS."""
    splits: dict[str, tuple[int, int | None]] | None = None
    """Each split's contiguous range of data indices: split -> (first index, end index or None). None: the
    bounded_splits of `size` when there is one, else DEFAULT_SPLITS. Splits never overlap; with a `size` every
    split ends within it and together they cover it. These ranges are the CONTIGUOUS scheme; their lengths are
    the split sizes of every scheme (STRATIFIED deals the same number of indices to each split)."""
    difficulty_profile: tuple[tuple[int, int], ...] | None = None
    """The difficulty of the server's data in its order, as runs ((difficulty, count), ...) adding up to `size`:
    what STRATIFIED stratifies by (None: the data index's decile). TextCraft's server sorts its goals by crafting
    min-depth, so its profile is the count of goals per depth, read once off AgentGym's crafting tree (and
    checked against it by tests/test_agentgym_splits.py)."""
    max_turns: int = 30
    """A sensible turn cap for this environment (its servers set none of their own, or a large one)."""
    template: str = "react"
    """The action template episodes are played with by default: AgentGym's agents reply ReAct-style."""
    send_task: bool = False
    """/reset gets the whole stored task (trajlake's own server, which also lists tasks at GET /tasks)."""
    create_returns_bare_int: bool = False
    """/create replies `N` rather than `{"id": N}` (WebShop, SQLGym): only trajlake's imitation server reads
    this, to answer in that shape; the client accepts both."""

    def __post_init__(self):
        if self.splits is None:
            object.__setattr__(self, "splits", bounded_splits(self.size) if self.size else dict(DEFAULT_SPLITS))
        if self.send_task:  # the server lists each split's tasks itself: the splits here are only their names
            return
        self._check_splits()
        if self.difficulty_profile is not None:
            object.__setattr__(self, "difficulty_profile", tuple((int(d), int(c)) for d, c in self.difficulty_profile))
            total = sum(count for _, count in self.difficulty_profile)
            if total != self.size or any(count <= 0 for _, count in self.difficulty_profile):
                raise ValueError(f"preset {self.name}: difficulty_profile counts {total} tasks in positive runs; "
                                 f"it must count the server's {self.size}")

    def _check_splits(self) -> None:
        """The splits are disjoint, non-empty ranges within the server's tasks, covering them all."""
        ranges = sorted((start, end, name) for name, (start, end) in self.splits.items())
        for (_, end, name), (start, _, after) in itertools.pairwise(ranges):
            if end is None or end > start:
                raise ValueError(f"preset {self.name}: splits {name} and {after} overlap")
        for name, (start, end) in self.splits.items():
            if self.size is not None and (end is None or end > self.size):
                raise ValueError(f"preset {self.name}: split {name} ends past the server's {self.size} tasks")
            if end is not None and end <= start:
                raise ValueError(f"preset {self.name}: split {name} is empty ({start}..{end})")
        if self.size is not None and sum(end - start for start, end in self.splits.values()) != self.size:
            raise ValueError(f"preset {self.name}: the splits leave some of the server's {self.size} tasks out; "
                             "they must cover them all (the stratified scheme deals every task to a split)")

    @property
    def env_name(self) -> str:
        return f"agentgym/{self.name}"

    @property
    def split_schemes(self) -> tuple[str, ...]:
        """The schemes this server's splits can be drawn by, the default first (SPLIT_SCHEMES)."""
        return SPLIT_SCHEMES if self.size else (CONTIGUOUS,)

    def scheme(self, name: str | None) -> str:
        """The split scheme `name` (None: this preset's default), checked; ValueError listing the valid ones."""
        if name is None:
            return self.split_schemes[0]
        valid = ", ".join(self.split_schemes)
        if name not in SPLIT_SCHEMES:
            raise ValueError(f"unknown split scheme {name!r} for {self.env_name}; valid: {valid}")
        if name not in self.split_schemes:
            raise ValueError(f"{self.env_name} has no known data size, so split scheme {name!r} cannot deal it; "
                             f"valid: {valid}")
        return name

    def split_size(self, split: str) -> int | None:
        """How many tasks `split` holds, under every scheme; None when it has no end (the data size is unknown)."""
        start, end = self.split_range(split)
        return None if end is None else end - start

    def split_range(self, split: str) -> tuple[int, int | None]:
        """(first data index, end index or None) of `split` under CONTIGUOUS; ValueError naming the valid splits."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r} for {self.env_name}; valid: {', '.join(self.splits)}")
        return self.splits[split]

    def task_indices(self, split: str, n: int | None, scheme: str) -> list[int]:
        """The data indices of the first `n` tasks of `split` under `scheme` (n None: all of them, or UNBOUNDED_N
        where the split has no end). CONTIGUOUS counts up from the split's start (AgentGym's evaluation sets are
        the low indices); STRATIFIED gives them in a seeded order, so the first n are a random sample of the
        split. ValueError when `n` is past the split's size."""
        scheme = self.scheme(scheme)
        start, _ = self.split_range(split)
        size = self.split_size(split)
        n = (UNBOUNDED_N if size is None else size) if n is None else n
        if size is not None and n > size:
            raise ValueError(f"{self.env_name} split {split!r} has {size} tasks ({scheme}); asked for {n}")
        if scheme == CONTIGUOUS:
            return list(range(start, start + n))
        return list(_stratified_order(*self._stratified_key())[split][:n])

    def check_index(self, index: int, split: str | None, scheme: str) -> None:
        """ValueError unless data index `index` lies in the server's data and in `split` under `scheme` (when the
        split is one of this server's): an index past either is refused, never wrapped onto another split's task."""
        if self.size is not None and not 0 <= index < self.size:
            raise ValueError(f"{self.env_name} has {self.size} tasks (data indices 0..{self.size - 1}); "
                             f"data index {index} is past its end")
        if split not in self.splits:
            return
        if self.scheme(scheme) == STRATIFIED:
            owner = _stratified_labels(*self._stratified_key())[index]
            if owner != split:
                raise ValueError(f"{self.env_name} split {split!r} ({STRATIFIED}) does not hold data index {index}; "
                                 f"that scheme puts it in {owner!r}")
            return
        start, end = self.splits[split]
        if index < start or (end is not None and index >= end):
            span = f"{start}..{end - 1}" if end is not None else f"{start} and up"
            raise ValueError(f"{self.env_name} split {split!r} ({CONTIGUOUS}) is data indices {span}; data index "
                             f"{index} is outside it")

    def split_difficulty(self, scheme: str) -> dict[str, dict[int, int]]:
        """split -> {difficulty: tasks} under `scheme`, where the preset knows its data's difficulty (its
        `difficulty_profile`); {} where it does not."""
        if not self.difficulty_profile:
            return {}
        depth = expand_profile(self.difficulty_profile)
        return {split: dict(sorted(Counter(depth[i] for i in self.task_indices(split, None, scheme)).items()))
                for split in self.splits}

    def _stratified_key(self) -> tuple[str, tuple[tuple[str, int], ...], tuple[tuple[int, int], ...] | None]:
        """What STRATIFIED's splits of this preset depend on, hashable for the caches: name, sizes, profile."""
        return self.name, tuple((s, self.split_size(s)) for s in self.splits), self.difficulty_profile

    def is_valid(self, observation: str) -> bool | None:
        """Whether the step was carried out, judged from its observation; None when this env does not say."""
        if not self.invalid_prefixes:
            return None
        return not observation.lstrip().startswith(self.invalid_prefixes)
