"""The trajectory viewer's pages (`trajlake view`), rendered from the lake at one pinned snapshot.

Three pages, every one a plain HTML file that works the same served (`trajlake view`) and exported
(`trajlake view --out DIR`): the runs; a run's episodes (filtered and sorted in the page: env, policy,
success, reward range under the chosen spec), and for an eval run whether its number is held out (how many of
its tasks the evaluated policy's lineage trained on, and its success on the clean rest); one episode, turn by
turn: the observation, the reply with each of its tokens shaded by the reward the spec allocated to it
(`token_rewards`; the value is in each token's title and `data-reward`), and beside the episode's reward its
group-relative advantage (GRPO's: the reward minus its group's mean, over the group's std), the parsed action,
format flag, step reward and info. Two episodes, or one episode under two specs, go side by side (`compare`).
"""

from __future__ import annotations

from functools import lru_cache

from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import path_component
from trajlake.evaluate.metrics import held_out_label
from trajlake.evaluate.viewer_html import attrs, esc, link, page, url_part
from trajlake.store.reads import eval_contamination, policy_source, reward_spec_names
from trajlake.store.runs import stored as stored_run

RUNS_SQL = """
SELECT r.run_id, r.kind, r.status, r.parent_run_id, count(e.episode_id) AS episodes,
       round(avg(e.success::INT), 3) AS success_rate, string_agg(DISTINCT e.env, ', ') AS envs,
       string_agg(DISTINCT e.policy_id, ', ') AS policies, r.started_at
FROM runs r LEFT JOIN episodes e USING (run_id) GROUP BY ALL ORDER BY r.started_at, r.run_id
"""
EPISODES_SQL = """
SELECT e.episode_id, e.env, e.policy_id, e.task_id, e.sample_index, e.status, e.success, e.env_reward,
       e.num_turns, e.num_agent_tokens, r.total AS reward
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = ?
WHERE e.run_id = ? ORDER BY e.episode_id
"""
EPISODE_SQL = """
SELECT e.*, t.instruction, r.total AS reward,
       (r.total - avg(r.total) OVER g) / nullif(stddev_samp(r.total) OVER g, 0) AS advantage,
       count(*) OVER g AS group_size
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = ?
     LEFT JOIN tasks t ON t.task_id = e.task_id
WHERE e.group_id IS NOT DISTINCT FROM (SELECT group_id FROM episodes WHERE episode_id = ?)
  AND (e.group_id IS NOT NULL OR e.episode_id = ?)
WINDOW g AS (PARTITION BY e.group_id)
"""
TURNS_SQL = """SELECT turn, observation, action_text, action, format_ok, step_reward, done, info::VARCHAR AS info,
prompt_token_ids, response_token_ids FROM turns WHERE episode_id = ? ORDER BY turn"""
TOKEN_REWARDS_SQL = "SELECT position, reward FROM token_rewards WHERE spec_id = ? AND episode_id = ?"


def _rate(value, wins, n) -> str:
    """A success rate with what it is over ("0.50 (2 of 4 episodes)"); "none" when nothing is under it."""
    return "none" if value is None or not n else f"{value:.2f} ({wins} of {n} episodes)"


class Links:
    """Where the pages are: served (`/run?id=<id>&spec=<spec>`: a query value, because a browser collapses a
    path segment `.` or `..` even percent-encoded) or exported (`runs/<file>.html`, relative to the page). Every
    id is quoted as one URL component; an exported page's file name is `page_file(id)`, and its link quotes
    that name again, because a browser decodes %XX in a path before it opens the file."""

    def __init__(self, static: bool):
        self.static = static

    @staticmethod
    def page_file(an_id: str) -> str:
        """The exported page of an id: one safe file name (no separator, `..` or control character)."""
        return path_component(an_id) + ".html"

    def _to(self, folder: str, route: str, an_id: str, spec: str | None, depth: int) -> str:
        if self.static:
            return "../" * depth + f"{folder}/{url_part(self.page_file(an_id))}"
        return f"/{route}?id={url_part(an_id)}" + (f"&spec={url_part(spec)}" if spec else "")

    def run(self, run_id: str, spec: str | None, depth: int = 0) -> str:
        return self._to("runs", "run", run_id, spec, depth)

    def episode(self, episode_id: str, spec: str | None, depth: int = 0) -> str:
        return self._to("episodes", "episode", episode_id, spec, depth)

    def index(self, depth: int = 0) -> str:
        return ("../" * depth + "index.html") if self.static else "/"


def shade(reward: float, scale: float) -> str:
    """A background for a token's reward: green for a positive one, red for a negative, stronger the larger."""
    if not reward or not scale:
        return "transparent"
    a = min(1.0, abs(reward) / scale) * 0.75 + 0.1
    return f"rgba(0,160,60,{a:.2f})" if reward > 0 else f"rgba(220,40,40,{a:.2f})"


class Pages:
    """The viewer's pages over `lake` at `snapshot`, rewards under spec `spec` (a spec id; None: none).
    Every value from the lake goes through `esc`, every id in a link through `Links` (see viewer_html)."""

    def __init__(self, lake, snapshot: int, spec: str | None, links: Links):
        self.lake, self.snapshot, self.spec, self.links = lake, snapshot, spec, links

    def q(self, sql: str, params: list | None = None):
        return self.lake.query(sql, params, snapshot=self.snapshot)

    def specs(self) -> list[tuple[str, str]]:
        return reward_spec_names(self.lake, snapshot=self.snapshot)

    def check_spec(self, spec: str | None) -> None:
        """A spec id someone asked for (a query parameter, --spec) must be one the lake has: an unknown one
        would show every reward as empty without a word."""
        if spec is not None and spec not in {sid for sid, _ in self.specs()}:
            raise TrajlakeError(f"no reward spec {spec!r} at snapshot {self.snapshot} "
                                "(trajlake sql \"SELECT spec_id, name FROM reward_specs\" lists them)")

    def _spec_line(self, make_link) -> str:
        if self.links.static:
            return f"<p class=\"muted\">rewards under spec {esc(self.spec or 'none')}</p>"
        items = [link(make_link(sid), f"{name} ({sid})") if sid != self.spec else f"<b>{esc(f'{name} ({sid})')}</b>"
                 for sid, name in self.specs()]
        return f"<p>rewards under spec: {' | '.join(items) or 'none scored yet'}</p>"

    def runs(self) -> str:
        rows = self.q(RUNS_SQL).to_dicts()
        body = [f"<h1>Runs</h1><p class=\"muted\">lake snapshot {esc(self.snapshot)}; {len(rows)} runs</p>",
                "<table id=\"runs\"><tr><th>run</th><th>kind</th><th>status</th><th>parent</th><th>episodes</th>"
                "<th>success</th><th>envs</th><th>policies</th><th>started</th></tr>"]
        for r in rows:
            name = link(self.links.run(r["run_id"], self.spec), r["run_id"]) if r["episodes"] else esc(r["run_id"])
            cells = [esc(r[k]) for k in ("kind", "status", "parent_run_id", "episodes", "success_rate", "envs",
                                         "policies", "started_at")]
            body.append(f"<tr><td>{name}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        return page("trajlake runs", "".join(body) + "</table>")

    def run(self, run_id: str) -> str:
        rows = self.q(EPISODES_SQL, [self.spec, run_id]).to_dicts()
        if not rows:
            raise TrajlakeError(f"no episodes in run {run_id!r} at snapshot {self.snapshot}")
        envs = sorted({r["env"] for r in rows if r["env"]})
        cols = [("episode", "id", False), ("env", "env", False), ("policy", "policy", False), ("task", "task", False),
                ("sample", "sample", True), ("status", "status", False), ("success", "success", False),
                ("env reward", "envreward", True), ("turns", "turns", True), ("agent tokens", "tokens", True),
                ("reward", "reward", True)]
        # the script attaches the sort listeners to these links (no onclick=: the CSP forbids it)
        head = "".join(f"<th>{link('#', t, data_sort=k, data_num=int(num))}</th>" for t, k, num in cols)
        depth = 1 if self.links.static else 0
        lines = []
        for r in rows:
            data = {"id": r["episode_id"], "env": r["env"], "policy": r["policy_id"], "task": r["task_id"],
                    "sample": r["sample_index"], "status": r["status"], "success": str(r["success"]).lower(),
                    "envreward": r["env_reward"], "turns": r["num_turns"], "tokens": r["num_agent_tokens"],
                    "reward": r["reward"]}
            cells = [link(self.links.episode(r["episode_id"], self.spec, depth), r["episode_id"][:8],
                          title=r["episode_id"])] + [esc(data[k]) for _, k, _ in cols[1:]]
            lines.append(f"<tr{attrs(**{f'data_{k}': v for k, v in data.items()})}>"
                         + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        env_options = "".join(f"<option>{esc(e)}</option>" for e in envs)
        filters = ("<form id=\"filters\" class=\"filters\">env <select name=\"env\"><option value=\"\">all</option>"
                   f"{env_options}</select> policy <input name=\"policy\"> success <select name=\"success\"><option "
                   "value=\"\">all</option><option>true</option><option>false</option></select> reward from <input "
                   "name=\"min_reward\"> to <input name=\"max_reward\"> "
                   f"&nbsp;<span id=\"shown\">{len(rows)}</span> of {len(rows)} shown</form>")
        body = (f"<p>{link(self.links.index(depth), 'runs')}</p><h1>Run {esc(run_id)}</h1>"
                + self._held_out(run_id) + self._spec_line(lambda s: self.links.run(run_id, s)) + filters
                + f"<table id=\"episodes\"><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>")
        return page(f"run {run_id}", body)

    def _held_out(self, run_id: str) -> str:
        """An eval run's summary of whether its number is held out ('' for a run of another kind): per env and
        split, the evaluated policy's tasks that share a task id or goal with what its lineage trained on, its
        success and the success on the clean tasks, labelled by `held_out_label`. A run whose tasks are not all
        clean opens with that label in a banner, so its success is not read as a held-out number."""
        run = stored_run(self.lake, run_id, snapshot=self.snapshot)
        if run is None or run.kind != "eval":
            return ""
        rows = eval_contamination(self.lake, [run_id], snapshot=self.snapshot).to_dicts()  # per env and split
        if not rows:
            return "<p class=\"muted\" id=\"held-out\">held out: no played episodes to measure (env errors only)</p>"
        banners, lines = [], []
        for r in rows:
            label = held_out_label(r["contaminated_tasks"], r["tasks"])
            where = f"{r['env']}, split {r['split'] or '?'}, policy {r['policy_id']}"
            if r["contaminated_tasks"]:
                banners.append(
                    f"<p class=\"notclean\">{esc(label)} ({esc(where)}): its success "
                    f"{esc(_rate(r['success_rate'], r['successes'], r['episodes']))} is not a held-out number; on "
                    f"the {esc(r['clean_tasks'])} clean tasks: "
                    f"{esc(_rate(r['clean_success_rate'], r['clean_successes'], r['clean_episodes']))}</p>")
            cells = [r["policy_id"], r["env"], r["split"], r["tasks"], r["contaminated_tasks"],
                     _rate(r["success_rate"], r["successes"], r["episodes"]), r["clean_tasks"],
                     _rate(r["clean_success_rate"], r["clean_successes"], r["clean_episodes"])]
            mark = "clean" if not r["contaminated_tasks"] else "notclean"
            lines.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                         + f"<td{attrs(class_=mark)}>{esc(label)}</td></tr>")
        head = "".join(f"<th>{t}</th>" for t in ("policy", "env", "split", "tasks", "trained on", "success",
                                                  "clean tasks", "clean success", "held out"))
        return ("".join(banners) + "<p>held out? tasks that share a task id or a goal with an episode the policy's "
                "lineage trained on (<code>trajlake sql --file docs/queries/contamination.sql</code>):</p>"
                f"<table id=\"held-out\"><tr>{head}</tr>{''.join(lines)}</table>")

    def _episode(self, episode_id: str, spec: str | None) -> str:
        """One episode's block (header and turns) under `spec`."""
        rows = self.q(EPISODE_SQL, [spec, episode_id, episode_id]).to_dicts()
        ep = next((r for r in rows if r["episode_id"] == episode_id), None)
        if ep is None:
            raise TrajlakeError(f"no episode {episode_id!r} at snapshot {self.snapshot}")
        turns = self.q(TURNS_SQL, [episode_id]).to_dicts()
        rewards = dict(self.q(TOKEN_REWARDS_SQL, [spec, episode_id]).rows()) if spec else {}
        scale = max((abs(v) for v in rewards.values()), default=0.0)
        tok = self._tokenizer(ep["run_id"], ep["policy_id"])
        adv = ep["advantage"]
        head = (f"<h2>Episode {esc(episode_id)}</h2><p>env {esc(ep['env'])}, task {esc(ep['task_id'])}, policy "
                f"{esc(ep['policy_id'])}, run {esc(ep['run_id'])}; status {esc(ep['status'])}, success "
                f"<b id=\"success\">{esc(ep['success'])}</b>, env reward {esc(ep['env_reward'])}; reward "
                f"<b{attrs(id='reward', data_spec=spec)}>{esc(ep['reward'])}</b> under spec {esc(spec or 'none')}"
                + (f", advantage <b id=\"advantage\">{adv:.3f}</b> (group of {esc(ep['group_size'])}: reward minus "
                   "the group's mean, over its std)" if adv is not None else "") + "</p>"
                + (f"<p class=\"instruction\">instruction: {esc(ep['instruction'])}</p>" if ep["instruction"] else "")
                + (f"<p class=\"error\">error: {esc(ep['error'])}</p>" if ep["error"] else ""))
        blocks, position = [], 0
        for t in turns:
            p, a = list(t["prompt_token_ids"] or ()), list(t["response_token_ids"] or ())
            position += len(p)
            if tok is not None and a:
                spans = []
                for k, token in enumerate(a):
                    r = rewards.get(position + k, 0.0)
                    # the colour goes in data-shade for the script to apply: the CSP forbids style= attributes
                    spans.append(f"<span{attrs(class_='tok', data_position=position + k, data_reward=r)}"
                                 f"{attrs(title=f'token {token}, reward {r:g}', data_shade=shade(r, scale))}>"
                                 f"{esc(tok.decode([token]))}</span>")
                reply = "".join(spans)
            else:
                reply = esc(t["action_text"])
            position += len(a)
            blocks.append(f"<div{attrs(class_='turn', data_turn=t['turn'])}><b>turn {esc(t['turn'])}</b>"
                          f"<div class=\"obs\">{esc(t['observation'])}</div><div class=\"reply\">{reply}</div><p>"
                          f"action <code>{esc(t['action'])}</code>, format ok {esc(t['format_ok'])}, step reward "
                          f"{esc(t['step_reward'])}, done {esc(t['done'])}, info <code>{esc(t['info'] or '{}')}</code>"
                          "</p></div>")
        return head + "".join(blocks)

    def episode(self, episode_id: str) -> str:
        depth = 1 if self.links.static else 0
        nav = f"<p>{link(self.links.index(depth), 'runs')}</p>"
        return page(f"episode {episode_id}", nav + self._spec_line(lambda s: self.links.episode(episode_id, s))
                    + self._episode(episode_id, self.spec))

    def compare(self, a: str, b: str, spec_b: str | None = None) -> str:
        """Episodes `a` and `b` side by side (the same spec), or `a` under this spec and `spec_b`."""
        self.check_spec(spec_b)
        left = self._episode(a, self.spec)
        right = self._episode(b, spec_b or self.spec)
        return page(f"compare {a} {b}", f"<p>{link(self.links.index(), 'runs')}</p><div class=\"side\">"
                    f"<div id=\"left\">{left}</div><div id=\"right\">{right}</div></div>")

    def _tokenizer(self, run_id: str | None, policy_id: str | None):
        return _tokenizer_for(self.lake, self.snapshot, run_id, policy_id)


@lru_cache(maxsize=32)
def _tokenizer_for(lake, snapshot: int, run_id: str | None, policy_id: str | None):
    """The tokenizer the episode's ids are in: the run's `tokenizer` (text policies), else the policy's
    checkpoint or base model; None when none of them loads (the reply is then shown as text)."""
    from trajlake.lm.load import load_tokenizer

    run = stored_run(lake, run_id, snapshot=snapshot) if run_id is not None else None
    candidates = []
    if run is not None and run.config:
        candidates.append(run.config.get("tokenizer"))
    source = policy_source(lake, policy_id, snapshot=snapshot)
    if source is not None:
        candidates += [source.checkpoint_uri, source.base_model]
    if policy_id and policy_id.startswith(("hf:", "vllm:")):
        candidates.append(policy_id.split(":", 1)[1])
    for c in candidates:
        if c:
            try:
                return load_tokenizer(c)
            except Exception:  # a folder moved or deleted since: try the next
                continue
    return None
