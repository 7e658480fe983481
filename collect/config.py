"""How episodes are played (`RolloutConfig`, shared by collect, train and evaluate) and the collect stage's
configuration (`CollectConfig`): dataclasses, every field documented once, checked at construction."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from trajlake.collect.templates import TEMPLATES
from trajlake.core.config_types import (
    added_later,
    check_field_types,
    operational,
    operational_fields,
    run_fields,
    setting,
)
from trajlake.core.errors import TrajlakeError

RUN_KINDS = ("collect", "eval")
TRUNCATION = ("stop",)
FORMAT_FALLBACKS = ("raw", "empty")

# Caps on what a run may ask for. A run holds its task list (task_offset + tasks tasks, about 1 kB each, made
# before the first episode) and its (task, sample) pairs in memory, and opens `concurrency` episode slots (and,
# for an env server, as many threads) at once: without caps a typo such as `--tasks 99999999999` was not
# refused but killed by the kernel for memory. Each is far beyond any run this toolkit makes; a bigger job is
# several runs (`--task-offset` moves on through the split).
#: tasks of one run
MAX_TASKS = 100_000
#: task_offset + tasks: the tasks made (and held) to play the last ones
MAX_TASK_INDEX = 1_000_000
#: samples per task
MAX_SAMPLES = 1_024
#: tasks x samples: the (task, sample) pairs of one run
MAX_EPISODES = 1_000_000
#: turns of one episode
MAX_TURNS = 100_000
#: reply and context token budgets (a model's context is far shorter: this only bounds a typo)
MAX_TOKENS = 10_000_000
#: live episodes at once (and threads for an env server)
MAX_CONCURRENCY = 4_096
#: policy replicas and env workers (Ray actors)
MAX_ACTORS = 1_024
#: seeds reach numpy's and vLLM's samplers, whose seeds are 32-bit (train adds its iteration to it)
MAX_SEED = 2**31 - 1
#: above this, logits / temperature samples nearly uniformly (train/config_checks.py has the same limit)
MAX_TEMPERATURE = 100.0
#: URL schemes an env server is reached by
URL_SCHEMES = ("http", "https")


def check_url(url: str | None, what: str = "env_url") -> str | None:
    """`url` if it is an http(s) URL with a host (None passes); else a TrajlakeError naming `what`. Checked
    before any request, so `file:///etc/passwd`, `notaurl` or `http://[::1` are refused in one line instead of
    reaching the HTTP client (or being stored as a run's setting)."""
    if url is None:
        return None
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url.strip():
        raise TrajlakeError(f"{what} must be an http(s) URL such as http://127.0.0.1:36001, got {url!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise TrajlakeError(f"{what} {url!r} holds a control character")
    try:
        parts = urlsplit(url)
        port = parts.port  # parsing the port is where a malformed one (":x", ":99999") fails
    except ValueError as e:
        raise TrajlakeError(f"{what} {url!r} is not a valid URL ({e})") from None
    if parts.scheme.lower() not in URL_SCHEMES or not parts.hostname:
        raise TrajlakeError(f"{what} must be an http(s) URL with a host, such as http://127.0.0.1:36001, "
                            f"got {url!r}")
    if port == 0:
        raise TrajlakeError(f"{what} {url!r}: port 0 is not a server's port")
    return url


def check_range(name: str, value: int, low: int, high: int, why: str = "") -> str | None:
    """The message refusing `value` outside [low, high] (None when it is in range)."""
    if value < low:
        return f"{name} must be >= {low}, got {value}"
    if value > high:
        return f"{name} must be at most {high:_}{why}, got {value}"
    return None


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How an episode is played: the env, its tasks' split and level, the prompt and template, sampling, the
    turn and context limits, and how many episodes play at once. Declared once here and inherited by
    CollectConfig, TrainConfig's rollout section (RolloutSection) and EvalConfig, with one set of defaults
    (EvalConfig plays the test split by default); `rollout_fields(config)` hands them on, and the CLI's options
    and help come from these fields."""

    #: how this config's errors begin, and their type (subclasses set them)
    config_name: ClassVar[str] = "rollout config"
    error_type: ClassVar[type[TrajlakeError]] = TrajlakeError

    env: str = setting("doors", help=(
        "Env to play (`trajlake envs` lists them); `agentgym/NAME` plays the AgentGym server at `env_url`."))
    env_url: str | None = operational(None, help=(
        "URL of the AgentGym env server an `agentgym/NAME` env plays (e.g. http://127.0.0.1:36001)."))
    split: str = setting("train", help="Task split: train, val or test.")
    difficulty: int | None = setting(None, help="Only tasks of this difficulty (None: all difficulties interleaved).")
    max_turns: int = setting(10, help=(
        "Turn cap per episode; an episode that reaches it is stored with status `truncated`."))
    template: str | None = setting(None, help=(
        "Action template the agent replies in: think_action, action, react or plain; None: the env's own default "
        "(react for AgentGym's servers, as AgentGym's agents reply; think_action for the others)."))
    system_prompt: str | None = setting(None, help=(
        "System message; None builds one from the env's description, actions and the template."))
    temperature: float = setting(1.0, help="Sampling temperature; 0 is greedy.")
    top_p: float = setting(1.0, help="Nucleus sampling mass.")
    max_new_tokens: int = setting(48, help="Reply length cap in tokens.")
    max_context_tokens: int = added_later(2048, help=(
        "Context budget: prompt tokens of an episode's whole history plus the next reply."))
    truncation: str = added_later("stop", help=(
        "What happens past the budget: `stop` ends the episode as `truncated` (no history is dropped, so the stored "
        "tokens stay exactly what the model saw)."))
    on_format_error: str = added_later("raw", help=(
        "What the env gets for a reply without a valid action: `raw` (the whole reply) or `empty`."))
    concurrency: int = operational(32, help=(
        "Live episodes at once: each turn their prompts go to the policy in one batched call."))
    replicas: int = operational(1, help=(
        "Copies of a model policy (hf, vllm, policy:ID), each a Ray actor, the live episodes spread over them (each "
        "stays on one); 1: the policy runs in this process. With RAY_ADDRESS set they are placed on that Ray "
        "cluster's nodes."))

    def __post_init__(self):
        check_field_types(self, self.config_name, self.error_type)  # first: the checks below compare values
        from trajlake.collect.envs.base import SPLITS

        # numbers first: NaN passes no comparison and infinity passes `>= 0`, so finiteness is its own rule
        for name in ("temperature", "top_p"):
            if not math.isfinite(getattr(self, name)):
                raise self.error_type(f"{self.config_name}: {name} must be a finite number, got {getattr(self, name)}")
        ranges = [("max_turns", 1, MAX_TURNS), ("max_new_tokens", 1, MAX_TOKENS),
                  ("max_context_tokens", 2, MAX_TOKENS), ("concurrency", 1, MAX_CONCURRENCY),
                  ("replicas", 1, MAX_ACTORS)]
        for name, low, high in ranges:
            message = check_range(name, getattr(self, name), low, high)
            if message:
                raise self.error_type(f"{self.config_name}: {message}")
        try:
            check_url(self.env_url)
        except TrajlakeError as e:
            raise self.error_type(f"{self.config_name}: {e}") from None
        checks = [
            (self.split in SPLITS, f"split must be one of {', '.join(SPLITS)}, got {self.split!r}"),
            (self.template is None or self.template in TEMPLATES,
             f"unknown template {self.template!r}; valid: {', '.join(TEMPLATES)}"),
            (self.truncation in TRUNCATION, f"unknown truncation {self.truncation!r}; valid: {TRUNCATION}"),
            (self.on_format_error in FORMAT_FALLBACKS,
             f"unknown on_format_error {self.on_format_error!r}; valid: {FORMAT_FALLBACKS}"),
            (self.max_context_tokens > self.max_new_tokens,
             f"max_context_tokens ({self.max_context_tokens}) must exceed max_new_tokens ({self.max_new_tokens})"),
            (0 <= self.temperature <= MAX_TEMPERATURE,
             f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0: greedy), got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
        ]
        for ok, message in checks:
            if not ok:
                raise self.error_type(f"{self.config_name}: {message}")
        env_cls = self.env_class
        if self.difficulty is not None and env_cls.max_steps and self.difficulty not in env_cls.max_steps:
            raise self.error_type(f"{self.config_name}: difficulty {self.difficulty} is not a level of env {self.env}; "
                                  f"valid: {', '.join(map(str, sorted(env_cls.max_steps)))}")

    @property
    def env_class(self):
        """The registered class of `env` (an unknown name is this config's error, listing the valid ones)."""
        from trajlake.collect.envs import env_class

        try:
            return env_class(self.env)
        except KeyError as e:
            raise self.error_type(f"{self.config_name}: {e.args[0]}") from None

    def check_env_url(self) -> None:
        """An env that plays an AgentGym server needs its URL; a built-in env takes none (its constructor has no
        `url`: given one, it failed with a TypeError deep in the env pool)."""
        if self.env_class.remote and not self.env_url:
            raise self.error_type(f"{self.config_name}: env {self.env} plays an AgentGym server: give its URL "
                                  "(--env-url URL)")
        if self.env_url and not self.env_class.remote:
            raise self.error_type(f"{self.config_name}: env {self.env} is built in and plays in this process; "
                                  "--env-url (env_url) is for an agentgym/NAME env's server: drop it")

    @property
    def template_name(self) -> str:
        """The template played with: `template`, else the env's default."""
        return self.template or self.env_class.default_template


ROLLOUT_FIELDS = tuple(f.name for f in dataclasses.fields(RolloutConfig))


def rollout_fields(config: RolloutConfig, **changes: Any) -> dict[str, Any]:
    """The RolloutConfig fields of `config` (a collect, train or eval config), with `changes`: what one stage
    hands the collect runs it makes."""
    return {**{name: getattr(config, name) for name in ROLLOUT_FIELDS}, **changes}


@dataclass(frozen=True, kw_only=True)
class CollectConfig(RolloutConfig):
    """What `trajlake collect` plays, with what, and how it stores it (how each episode plays: RolloutConfig)."""

    config_name: ClassVar[str] = "collect config"

    policy: str = setting(help="Policy spec: hf:PATH, vllm:PATH, openai:URL#MODEL, scripted:ENV or policy:ID.")
    tasks: int = setting(32, help=(
        "How many tasks of the split to play (the first N after `task_offset`, difficulties interleaved)."))
    task_offset: int = setting(0, help=(
        "Skip this many tasks of the split first (the train loop moves on through the split every iteration)."))
    task_positions: tuple[int, ...] = added_later((), help=(
        "Play exactly these tasks: their positions in the split's task list (0 is its first task), in this order; "
        "then `tasks` must be their number and task_offset 0. What a train run's task_selector chose, recorded with "
        "the collect run. Empty: the first `tasks` after task_offset."))
    samples: int = setting(1, help="Samples per task (K); the K episodes of a task share a group_id (GRPO groups).")
    run_id: str | None = operational(None, help=(
        "Run id; restarting with the same id resumes: it plays the (task, sample) pairs not stored yet and retries "
        "those whose every stored episode ended in an env error. The other fields that define the run (RUN_FIELDS) "
        "must then be the ones it was started with."))
    workers: int = operational(0, help=(
        "Ray actors stepping envs (0: in-process for built-in envs, a thread pool for HTTP envs)."))
    seed: int = setting(0, help="Seeds the policy's sampler (reproducible runs; samples of one task still differ).")
    tokenizer: str | None = setting(None, help=(
        "Tokenizer folder for text policies (scripted, openai): their replies are stored under it."))
    chunk_turns: int = operational(1000, help=(
        "Write to the store once this many turns are buffered (one snapshot per chunk)..."))
    chunk_seconds: float = operational(30.0, help="...or once this many seconds passed since the last write.")
    env_kwargs: dict[str, Any] = setting(default_factory=dict, help=(
        "Extra arguments for the env's constructor (the server's URL is `env_url`)."))
    progress: bool = operational(True, help="Show a progress bar and a summary table.")
    run_kind: str = setting("collect", help=(
        "The `runs.kind` recorded: `collect`, or `eval` for held-out evaluation (trajlake evaluate, train evals)."))
    parent_run_id: str | None = setting(None, help=(
        "The run this one belongs to (a train run for its rollouts and evals), recorded in `runs`."))

    def __post_init__(self):
        super().__post_init__()
        if not math.isfinite(self.chunk_seconds):
            raise TrajlakeError(f"collect config: chunk_seconds must be a finite number, got {self.chunk_seconds}")
        cap = " (the cap of one run: split bigger jobs over runs with --task-offset)"
        ranges = [("tasks", self.tasks, 1, MAX_TASKS, cap), ("task_offset", self.task_offset, 0, MAX_TASK_INDEX, cap),
                  ("task_offset + tasks", self.task_offset + self.tasks, 1, MAX_TASK_INDEX, cap),
                  ("samples", self.samples, 1, MAX_SAMPLES, ""),
                  ("tasks x samples", self.tasks * self.samples, 1, MAX_EPISODES, cap),
                  ("workers", self.workers, 0, MAX_ACTORS, ""), ("seed", self.seed, 0, MAX_SEED, ""),
                  ("chunk_turns", self.chunk_turns, 1, MAX_EPISODES, "")]
        for name, value, low, high, why in ranges:
            message = check_range(name, value, low, high, why)
            if message:
                raise TrajlakeError(f"collect config: {message}")
        checks = [
            (self.tasks >= 1, f"tasks must be >= 1, got {self.tasks}"),
            (self.task_offset >= 0, f"task_offset must be >= 0, got {self.task_offset}"),
            (self.run_kind in RUN_KINDS, f"unknown run_kind {self.run_kind!r}; valid: {', '.join(RUN_KINDS)}"),
            (self.samples >= 1, f"samples must be >= 1, got {self.samples}"),
            (self.workers >= 0, f"workers must be >= 0, got {self.workers}"),
            (self.chunk_turns >= 1, f"chunk_turns must be >= 1, got {self.chunk_turns}"),
            (self.chunk_seconds > 0, f"chunk_seconds must be > 0, got {self.chunk_seconds}"),
            ("url" not in self.env_kwargs, "the env server's URL is env_url, not env_kwargs['url']"),
            (not self.task_positions or (len(self.task_positions) == self.tasks and self.task_offset == 0),
             f"task_positions ({len(self.task_positions)} given) needs tasks equal to their number and task_offset 0"),
            (all(0 <= p < MAX_TASK_INDEX for p in self.task_positions)
             and len(set(self.task_positions)) == len(self.task_positions),
             f"task_positions must be distinct positions in [0, {MAX_TASK_INDEX:_})"),
        ]
        for ok, message in checks:
            if not ok:
                raise TrajlakeError(f"collect config: {message}")
        self.check_env_url()
        if self.policy.startswith(("scripted", "openai:")) and not self.tokenizer:
            raise TrajlakeError(
                f"collect config: policy {self.policy!r} replies in text; give tokenizer=PATH (the model whose "
                "chat template the episodes are stored under, e.g. models/tiny)"
            )

    @property
    def env_args(self) -> dict[str, Any]:
        """The env constructor's arguments: `env_kwargs`, and the server's `url` when `env_url` is set."""
        return {**self.env_kwargs, **({"url": self.env_url} if self.env_url else {})}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, stored: dict[str, Any], *, system_prompt: str | None = None) -> list[tuple[str, Any, Any]]:
        """(field, stored value, given value) for each field of RUN_FIELDS where this config differs from the
        `stored` config of the run it resumes (`runs.config`; trajlake.store.runs.differences). `system_prompt`
        is the effective system message (this config's, or the one built from the env); with neither, it is not
        compared. An unset template is the env's default, and env_kwargs that say where the env server is
        (OPERATIONAL_ENV_KWARGS) are left out."""
        def adjust(name: str, old: Any, new: Any) -> tuple[Any, Any] | None:
            if name == "system_prompt":
                new = system_prompt if system_prompt is not None else new
                return None if new is None else (old, new)
            if name == "template":  # None plays the env's default: compare the templates actually played
                default = self.env_class.default_template
                return old or default, new or default
            if name == "env_kwargs":
                return ({k: v for k, v in (old or {}).items() if k not in OPERATIONAL_ENV_KWARGS},
                        {k: v for k, v in (new or {}).items() if k not in OPERATIONAL_ENV_KWARGS})
            return old, new

        from trajlake.store.runs import differences  # the ledger's module reads the stored schemas: pyarrow

        return differences(stored, self, adjust=adjust, order=REFUSAL_ORDER)


# What makes a run the run it is. A run id names one set of episodes, and its `runs.config` row says how they
# were played; a resumed run adds episodes under that row, so it must play them the same way, or the run would
# hold episodes of two settings under one description (and GRPO groups, success rates and evals would mix
# them). So every field that changes which (task, sample) pairs exist or how an episode plays out defines the
# run: the env and its constructor arguments, the tasks (split, tasks, task_offset, difficulty, samples), the
# policy, sampling (temperature, top_p, max_new_tokens, seed), the episode rules (max_turns, template,
# on_format_error, max_context_tokens, truncation), the prompt and the tokenizer the ids are stored under
# (system_prompt, tokenizer), and where the run belongs (run_kind, parent_run_id). Growing `tasks` or
# `samples` is refused too: that is a new run (the stored config would no longer describe this one).
# How a run is carried out, not what it plays, is declared `operational` on its field and may differ on every
# restart (fewer live episodes on a smaller machine, policy replicas and Ray workers or none, other chunk sizes,
# no progress bar; the run id is the key itself).
#: the order a refused resume names the fields that differ in: what is played, by whom, how it samples, the
#: episode's rules, its prompt, where the run belongs (a field not listed follows, in declaration order)
REFUSAL_ORDER = ("env", "env_kwargs", "policy", "split", "tasks", "task_offset", "task_positions", "samples",
                 "difficulty", "max_turns", "temperature", "top_p", "max_new_tokens", "seed", "template",
                 "on_format_error", "max_context_tokens", "truncation", "system_prompt", "tokenizer", "run_kind",
                 "parent_run_id")
#: the fields that identify a collect run (every field not declared `operational`), in REFUSAL_ORDER
RUN_FIELDS = run_fields(CollectConfig, REFUSAL_ORDER)
#: the fields declared `operational`: how a run is carried out, which a restart may change
OPERATIONAL_FIELDS = operational_fields(CollectConfig)
# env_kwargs of an env server's client that say where the server is and how patiently to call it, not which env
# it serves: a server restarted elsewhere (another port or host) still serves the same tasks. (Which AgentGym
# environment it is, `agentgym/NAME`, is the env itself, and stays part of the run.)
OPERATIONAL_ENV_KWARGS = ("url", "timeout", "connect_timeout", "retries", "backoff")
