"""The rollout loop: plays batched multi-turn episodes and writes them, token for token, to the store.

Each turn, the prompts of every live episode go to the policy in one call; the envs then step (in-process,
on threads or on Ray actors). Episodes that finish free their slot for the next (task, sample). Finished
episodes are written with their turns in chunks, one snapshot per chunk, so nothing half-written is ever
visible. A run restarted with the same run id (and the same settings: see config.RUN_FIELDS) skips the
(task, sample) pairs already played and retries those whose every stored episode ended in an env error; the
failed attempts stay in the store as history, and a retry gets an episode id of its own (`episode_id`'s
`attempt`). A run whose every (task, sample) ended in an env error is marked `failed` and raises.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trajlake.collect.chat import ChatRenderer
from trajlake.collect.config import RUN_KINDS, CollectConfig
from trajlake.collect.envpool import EnvPool, LocalEnvPool, Outcome, RayEnvPool
from trajlake.collect.policies import Policy, Request, SamplingParams, load_policy, load_replicated
from trajlake.collect.templates import get_template
from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Episode, Run, Task, Turn
from trajlake.schemas import Policy as PolicyRow
from trajlake.store import Lake, runs
from trajlake.store import lease as run_lease
from trajlake.store.reads import RunErrors, run_errors

_IDS = uuid.UUID("5b0c1f4e-2a8e-4d67-9a39-7f1f2b7f0c11")  # namespace of episode ids




def episode_id(run_id: str, task_id: str, sample: int, attempt: int = 0) -> str:
    """Deterministic, so a resumed run writes the same ids and the store skips what it already has.

    `attempt` 0 is a (task, sample)'s first episode (its id is the same as before retries existed, so old lakes
    resume as they did); attempt n >= 1 is its n-th retry after env errors. A resumed run picks the first
    attempt whose id is not stored yet, so a crash during a retry and another resume still writes each once.
    """
    key = f"{run_id}/{task_id}/{sample}" + (f"/attempt-{attempt}" if attempt else "")
    return str(uuid.uuid5(_IDS, key))


class EnvErrorsOnly(TrajlakeError):
    """Every (task, sample) of a collect run ended in an env error (the run is stored as failed): nothing was
    played that says anything about the policy. `what` says so without the advice the message ends with."""

    def __init__(self, run_id: str, errors: RunErrors):
        self.run_id, self.errors = run_id, errors
        self.what = f"all {errors.pairs} episodes ended with an env error (e.g. {errors.example})"
        super().__init__(f"collect run {run_id} failed: {self.what}; the run is marked failed: re-run with "
                         f"--run-id {run_id} once the env works")


def stored_run(lake: Lake, config: CollectConfig, system_prompt: str | None = None) -> runs.StoredRun | None:
    """The stored run that `config` resumes, or None for a new run. Raises, writing nothing, when that run is
    not a collect or eval run or was played with other settings (config.RUN_FIELDS)."""
    return runs.find(lake, config.run_id, config, kinds=RUN_KINDS, error=config.error_type,
                     system_prompt=system_prompt)


@dataclass
class _Live:
    """An episode in progress."""

    slot: int
    task: Task
    sample: int
    episode_id: str
    conv: Any
    observation: str = ""
    context: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    started_at: datetime = field(default_factory=utc_now)
    reward: float = 0.0


def make_env_factory(config: CollectConfig):
    from trajlake.collect.envs import make_env

    make_env(config.env, **config.env_args)  # fail now, with the list of envs, if the name is wrong
    return lambda: make_env(config.env, **config.env_args)


def system_prompt(env: Any, template) -> str:
    parts = [getattr(env, "description", ""), f"Actions: {env.action_help}" if getattr(env, "action_help", "") else ""]
    return "\n".join(p for p in parts + [template.instruction] if p)


class Rollout:
    """One collect run. `run()` plays every pending (task, sample) and returns the run id."""

    def __init__(self, config: CollectConfig, lake: Lake, ledger: runs.OpenRun, policy: Policy | None = None):
        self.config = config
        self.lake = lake
        self.ledger = ledger  # the run in the ledger (collect()'s runs.open): its lease, first write and end
        self.template = get_template(config.template_name)
        factory = make_env_factory(config)
        self.probe_env = factory()
        if policy is not None:
            self.policy = policy
        elif config.replicas > 1:
            self.policy = load_replicated(config.policy, config.replicas, lake=lake)
        else:
            self.policy = load_policy(config.policy, env=config.env, template=self.template, lake=lake,
                                      tokenizer_path=config.tokenizer)
        if self.policy.tokenizer is None:
            raise TrajlakeError(f"policy {config.policy} has no tokenizer: give --tokenizer PATH")
        self.renderer = ChatRenderer(self.policy.tokenizer)
        self.params = SamplingParams(config.temperature, config.top_p, config.max_new_tokens, config.seed)
        self.run_id = ledger.run_id
        self.pool: EnvPool = (RayEnvPool(factory, config.workers) if config.workers > 0
                              else LocalEnvPool(factory, threads=config.concurrency if self.probe_env.remote else 0))
        self.system = config.system_prompt or system_prompt(self.probe_env, self.template)
        self._buffer_eps: list[Episode] = []
        self._buffer_turns: list[Turn] = []
        self._last_flush = time.monotonic()
        self.generated_tokens = 0

    # ---- setup ---------------------------------------------------------------------------------
    def _tasks(self) -> list[Task]:
        c = self.config
        if c.task_positions:  # a train run's task selector chose them
            listed = self.probe_env.tasks(c.split, n=max(c.task_positions) + 1, difficulty=c.difficulty)
            return [listed[p] for p in c.task_positions]
        tasks = self.probe_env.tasks(c.split, n=c.task_offset + c.tasks, difficulty=c.difficulty)[c.task_offset:]
        if not tasks:
            raise TrajlakeError(f"env {c.env} split {c.split!r} has no tasks after task_offset {c.task_offset}")
        return tasks

    def _register(self, tasks: list[Task], pending: deque) -> None:
        """Write the run, the policy and the tasks (idempotent: a resumed run adds nothing); a resumed run with
        episodes to play is marked running again."""
        p = self.policy
        run = Run(self.run_id, self.config.run_kind,
                  config={**self.config.to_dict(), "exact_tokens": p.exact_tokens, "system_prompt": self.system},
                  status="running", started_at=utc_now(), parent_run_id=self.config.parent_run_id)
        rows: dict[str, list] = {"tasks": tasks}
        if not self.config.policy.startswith("policy:"):
            rows["policies"] = [PolicyRow(p.policy_id, run_id=self.run_id, base_model=p.model_path,
                                          checkpoint_uri=p.model_path, created_at=utc_now())]
        self.ledger.begin(run, message=f"collect: start run {self.run_id}", rows=rows)
        if self.ledger.resumed is not None and pending:
            self.ledger.restart()

    def _pending(self, tasks: list[Task]) -> deque:
        """(task, sample, episode id) of every pair still to play: never stored, or stored only with env errors
        (then the id of its next attempt)."""
        rows = self.lake.query("SELECT episode_id, task_id, sample_index, status FROM episodes WHERE run_id = ?",
                               [self.run_id])
        ids = set(rows["episode_id"].to_list())
        listed = {t.task_id for t in tasks}
        stray = sorted(set(rows["task_id"].to_list()) - listed)
        if stray:  # the same settings list other tasks now: playing on would mix two task lists in one run
            raise TrajlakeError(
                f"collect run {self.run_id} holds episodes of {len(stray)} task(s) its settings no longer list "
                f"(e.g. {stray[0]!r}): the env's task list changed (AgentGym's sized splits are stratified since "
                f"split scheme stratified-v1; env_kwargs split_scheme=\"contiguous\" plays an older run on); "
                "use a new run id")
        played = {(t, k) for t, k, s in zip(rows["task_id"], rows["sample_index"], rows["status"], strict=True)
                  if s != "error"}
        pending: deque = deque()
        for t in tasks:
            for k in range(self.config.samples):
                if (t.task_id, k) in played:
                    continue
                attempt = 0
                while (eid := episode_id(self.run_id, t.task_id, k, attempt)) in ids:
                    attempt += 1
                pending.append((t, k, eid))
        return pending

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> str:
        try:
            self.probe_env.check_server()  # a server of another environment is refused before anything is stored
            tasks = self._tasks()
            resumed = self.ledger.find(system_prompt=self.system)  # refuses other settings, writing nothing
            pending = self._pending(tasks)
            # One live process per run id (store/lease.py), taken before the first write; a run of a train run
            # (parent_run_id) is covered by that run's lease. A resume with nothing left to do writes nothing,
            # so it takes none either.
            idle = resumed is not None and not pending and resumed.status == "finished"
            if self.ledger.lease is None and self.config.parent_run_id is None and not idle:
                self.ledger.take_lease(system_prompt=self.system)  # and finds the run as the last holder left it
                resumed, pending = self.ledger.resumed, self._pending(tasks)
            self._register(tasks, pending)
        except BaseException:
            self.pool.close()
            raise
        from trajlake.collect.progress import CollectProgress

        retries = sum(eid != episode_id(self.run_id, t.task_id, k) for t, k, eid in pending)
        bar = CollectProgress(len(pending), enabled=self.config.progress, run_id=self.run_id, retries=retries)
        live: dict[int, _Live] = {}
        free = deque(range(self.config.concurrency))
        try:
            self.policy.reset_rng(self.config.seed)  # in the try: a policy failing here fails the run too
            with bar:
                if placed := self.placement():
                    bar.note(f"on Ray: {placed}")
                while pending or live:
                    self._start(pending, free, live, bar)
                    if live:
                        self._turn(live, free, bar)
                    self._maybe_flush()
            self._flush()
            errors = run_errors(self.lake, self.run_id)
            status = "failed" if errors.pairs and errors.errored == errors.pairs else "finished"
            if not bar.total and resumed is not None and resumed.status == status:
                self.ledger.keep_status()  # an idle resume leaves the row be
            elif status == "failed":
                self.ledger.fail(EnvErrorsOnly(self.run_id, errors).what)
            else:
                self.ledger.finish()
        except BaseException:
            self._flush()  # finished episodes are kept even when the run dies (runs.open marks it failed)
            raise
        finally:
            self.pool.close()
        if status == "failed":
            raise EnvErrorsOnly(self.run_id, errors)
        return self.run_id

    def placement(self) -> str:
        """Where this run's Ray actors live, as one line ("" when nothing runs on Ray)."""
        parts = []
        for what, nodes in (("policy replicas", self.policy.nodes()), ("env workers", self.pool.nodes())):
            if nodes:
                n = len(set(nodes))
                parts.append(f"{len(nodes)} {what} on {n} node{'s' if n > 1 else ''}")
        return ", ".join(parts)

    def _start(self, pending: deque, free: deque, live: dict[int, _Live], bar) -> None:
        starting = []
        while pending and free:
            task, k, eid = pending.popleft()
            slot = free.popleft()
            ep = _Live(slot, task, k, eid, None)
            starting.append(ep)
        if not starting:
            return
        for ep, obs in zip(starting, self.pool.reset([(ep.slot, ep.task) for ep in starting]), strict=True):
            if isinstance(obs, Outcome):
                self._finish(ep, free, bar, status="error", error=f"reset failed: {obs.error}")
                continue
            ep.observation = obs
            ep.conv = self.renderer.conversation([{"role": "system", "content": self.system}])
            self.policy.start_episode(ep.episode_id, ep.task)
            live[ep.slot] = ep

    def _turn(self, live: dict[int, _Live], free: deque, bar) -> None:
        eps = list(live.values())
        prompts = {}
        for ep in list(eps):
            prompt = ep.conv.observe(ep.observation)
            if len(ep.context) + len(prompt) + self.config.max_new_tokens > self.config.max_context_tokens:
                del live[ep.slot]
                eps.remove(ep)
                self._finish(ep, free, bar, status="truncated", error="context budget reached")
                continue
            ep.context.extend(prompt)
            prompts[ep.slot] = prompt
        if not eps:
            return
        requests = [Request(ep.episode_id, ep.context, ep.conv.messages, ep.task, ep.observation) for ep in eps]
        t0 = time.perf_counter()
        gens = self.policy.generate(requests, self.params)
        latency = (time.perf_counter() - t0) * 1000
        actions, replies = [], []
        for ep, gen in zip(eps, gens, strict=True):
            if self.policy.exact_tokens:
                ids, logprobs = list(gen.token_ids), gen.logprobs
                content = ep.conv.reply_ids(ids)
            else:
                content = gen.text or ""
                ids, logprobs = ep.conv.reply(content), None
            ep.context.extend(ids)
            self.generated_tokens += len(ids)
            action = self.template.parse(content)
            fallback = content if self.config.on_format_error == "raw" else ""
            actions.append((ep.slot, action if action is not None else fallback))
            replies.append((content, action, ids, logprobs))
        outcomes = self.pool.step_many(actions)
        for ep, (content, action, ids, logprobs), out in zip(eps, replies, outcomes, strict=True):
            info = dict(out.info or {})
            if out.error is not None:
                info["error"] = out.error
            last = out.done or out.error is not None or len(ep.turns) + 1 >= self.config.max_turns
            if last and out.observation:
                info["final_observation"] = out.observation
            ep.turns.append(Turn(
                ep.episode_id, len(ep.turns), observation=ep.observation, action_text=content, action=action,
                format_ok=action is not None, step_reward=out.reward, done=out.done, info=info,
                prompt_token_ids=prompts[ep.slot], response_token_ids=ids, response_logprobs=logprobs,
                latency_ms=latency,
            ))
            ep.reward += out.reward
            if out.error is not None:
                status, error = "error", out.error
            elif out.done:
                status, error = "ok", None
            elif last:
                status, error = "truncated", f"max_turns ({self.config.max_turns}) reached"
            else:
                ep.observation = out.observation
                continue
            del live[ep.slot]
            self._finish(ep, free, bar, status=status, error=error, success=bool(info.get("success", False)))

    def _finish(self, ep: _Live, free: deque, bar, *, status: str, error: str | None = None,
                success: bool = False) -> None:
        self.policy.end_episode(ep.episode_id)
        self.pool.release(ep.slot)
        free.append(ep.slot)
        agent_tokens = sum(len(t.response_token_ids) for t in ep.turns)
        self._buffer_eps.append(Episode(
            ep.episode_id, run_id=self.run_id, policy_id=self.policy.policy_id, task_id=ep.task.task_id,
            env=ep.task.env, group_id=f"{self.run_id}:{ep.task.task_id}", sample_index=ep.sample, status=status,
            success=success and status == "ok", env_reward=ep.reward, num_turns=len(ep.turns),
            num_agent_tokens=agent_tokens, error=error, started_at=ep.started_at, finished_at=utc_now(),
        ))
        self._buffer_turns.extend(ep.turns)
        bar.episode_done(success and status == "ok", agent_tokens, error=status == "error")

    def _maybe_flush(self) -> None:
        if (len(self._buffer_turns) >= self.config.chunk_turns
                or time.monotonic() - self._last_flush >= self.config.chunk_seconds):
            self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._buffer_eps:
            return
        n = len(self._buffer_eps)
        self.lake.append({"episodes": self._buffer_eps, "turns": self._buffer_turns}, stage="collect",
                         run_id=self.run_id, message=f"collect: {n} episodes of run {self.run_id}")
        self._buffer_eps, self._buffer_turns = [], []


def collect(config: CollectConfig, lake: Lake, policy: Policy | None = None) -> str:
    """Play `config` into `lake`; returns the run id (pass it again to resume, or to retry the episodes that
    ended in env errors). Raises TrajlakeError, writing nothing, when `config.run_id` names a stored run played
    with other settings, and, once it is marked failed, when every episode of the run ended in an env error."""
    run_id = config.run_id or runs.new_run_id("collect")
    with runs.open(lake, config.run_kind, config, run_id=run_id, kinds=RUN_KINDS, stage="collect",
                   error=config.error_type, lease=False) as ledger:  # refused before a model loads
        if config.run_id and config.parent_run_id is None:
            if ledger.resumed is None or ledger.resumed.status != "finished":
                # the lease before the policy loads (seconds; minutes for vLLM or replicas), so a second process
                # with this run id is refused at once; a finished run may have nothing left to play, and an idle
                # resume writes nothing, so it only checks here and Rollout.run takes the lease if there is work
                ledger.take_lease()
            else:
                run_lease.check(lake, config.run_id)  # a run another live process is playing (reads only)
        rollout = Rollout(config, lake, ledger, policy)
        try:
            return rollout.run()
        finally:
            if policy is None:
                rollout.policy.close()
