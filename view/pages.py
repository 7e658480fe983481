"""The trajectory viewer's pages (`trajlake view`), rendered from the lake at one pinned snapshot.

Its pages, every one a plain HTML file that works the same served (`trajlake view`) and exported
(`trajlake view --out DIR`): the runs (by kind, train runs first, each with the runs under it); a run's
episodes (filtered and sorted in the page: env, policy, success, reward range under the chosen spec; a run of
more than RUN_PAGE_ROWS episodes in parts of that many),
and for an eval run whether its number is held out (how many of its tasks the evaluated policy's lineage
trained on, and its success on the clean rest); one episode, turn by turn: the observation, the reply with
each of its tokens shaded by the reward the spec allocated to it (`token_rewards`; the value is in each
token's title and `data-reward`), and beside the episode's reward its group-relative advantage (GRPO's: the
reward minus its group's mean, over the group's std), the parsed action, format flag, step reward and info.
Two episodes, or one episode under two specs, go side by side (`compare`). A train run has its own pages
(train_pages): its curves, evals, config, policies and steps (`train`), its evals compared on the same tasks
(`evals`; any two eval runs: `eval_pair`) and what each step trained on (`trained`), read by train_data
for one run here and for every train run at once by the export.

`Pages` reads one page's rows (a few queries, each filtered by the id the page is of, so DuckLake reads only
the files whose statistics hold it) and renders them with render's functions; the export reads every
page's rows in bulk (export) and renders with the same functions.
"""

from __future__ import annotations

from functools import lru_cache

from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import path_component
from trajlake.store.reads import eval_contamination, policy_source, reward_spec_names
from trajlake.store.runs import stored as stored_run
from trajlake.view.evals import pair_page
from trajlake.view.markup import esc, link, page, url_part
from trajlake.view.render import (
    RUN_PAGE_ROWS,
    TokenText,
    episode_block,
    episode_page,
    held_out_block,
    rewards_from_spans,
    run_page,
    runs_page,
    shade,
)
from trajlake.view.train_data import (
    TRAINED_FROM_SQL,
    eval_pair,
    read_train,
    sparks,
)
from trajlake.view.train_pages import train_evals_page, train_page, trained_page

RUNS_SQL = """
SELECT r.run_id, r.kind, r.status, r.parent_run_id, count(e.episode_id) AS episodes,
       round(avg(e.success::INT), 3) AS success_rate, string_agg(DISTINCT e.env, ', ') AS envs,
       string_agg(DISTINCT e.policy_id, ', ') AS policies, r.started_at, coalesce(s.steps, 0) AS steps
FROM runs r LEFT JOIN episodes e USING (run_id)
     LEFT JOIN (SELECT run_id, count(*) AS steps FROM train_steps GROUP BY run_id) s USING (run_id)
GROUP BY ALL ORDER BY r.started_at, r.run_id
"""
#: the first $4 of the episodes step $3 of train run $2 trained on (by id), rewards under spec $1, with how
#: many there are
TRAINED_SQL = """
SELECT e.episode_id, e.run_id, e.env, e.policy_id, e.task_id, e.sample_index, e.status, e.success, e.env_reward,
       e.num_turns, e.num_agent_tokens, r.total AS reward, count(*) OVER () AS total
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = $1
WHERE e.episode_id IN (SELECT unnest(episode_ids) FROM train_steps WHERE run_id = $2 AND step = $3)
ORDER BY e.episode_id LIMIT $4
"""
#: a part of a run's episodes ($3 rows from row $4), with how many it has in all and the run's kind ($1: the spec)
EPISODES_SQL = """
SELECT e.episode_id, e.env, e.policy_id, e.task_id, e.sample_index, e.status, e.success, e.env_reward,
       e.num_turns, e.num_agent_tokens, r.total AS reward, count(*) OVER () AS total,
       (SELECT kind FROM runs WHERE run_id = $2) AS run_kind
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = $1
WHERE e.run_id = $2 ORDER BY e.episode_id LIMIT $3 OFFSET $4
"""
#: episode $2's group (itself alone without one) with each one's reward under spec $1 and group advantage
EPISODE_SQL = """
SELECT e.*, t.instruction, r.total AS reward,
       (r.total - avg(r.total) OVER g) / nullif(stddev_samp(r.total) OVER g, 0) AS advantage,
       count(*) OVER g AS group_size
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = $1
     LEFT JOIN tasks t ON t.task_id = e.task_id
WHERE e.group_id IS NOT DISTINCT FROM (SELECT group_id FROM episodes WHERE episode_id = $2)
  AND (e.group_id IS NOT NULL OR e.episode_id = $2)
WINDOW g AS (PARTITION BY e.group_id)
"""
#: what a page shows of a turn; the prompt's stored id count, not its ids: a page needs only where each reply
#: starts
TURN_COLUMNS = """turn, observation, action_text, action, format_ok, step_reward, done, info::VARCHAR AS info,
num_prompt_tokens, response_token_ids"""
#: one episode page in one query (each query pins the snapshot anew, a good part of its time): the episode's
#: row, its turns in order and its token rewards as `reward_spans` rows (one per agent segment, expanded by
#: `rewards_from_spans`), each read with a filter on the episode id
EPISODE_PAGE_SQL = f"""
WITH ep AS ({EPISODE_SQL})
SELECT ep.*,
       (SELECT list(t ORDER BY t.turn) FROM (SELECT {TURN_COLUMNS} FROM turns WHERE episode_id = $2) t) AS turn_rows,
       (SELECT list(s) FROM (SELECT position, length, reward FROM reward_spans
                             WHERE spec_id = $1 AND episode_id = $2) s) AS span_rows
FROM ep WHERE ep.episode_id = $2
"""


class Links:
    """Where the pages are: served (`/run?id=<id>&spec=<spec>`: a query value, because a browser collapses a
    path segment `.` or `..` even percent-encoded) or exported (`runs/<file>.html`, relative to the page). Every
    id is quoted as one URL component; an exported page's file name is `page_file(id)`, and its link quotes
    that name again, because a browser decodes %XX in a path before it opens the file. Part N > 1 of a long
    run is `&page=N` served and `page_file(id, N)` exported."""

    def __init__(self, static: bool):
        self.static = static

    @staticmethod
    def page_file(an_id: str, part: int = 1) -> str:
        """The exported page of an id: one safe file name (no separator, `..` or control character); part N > 1
        of a run adds `%pN`, which no id's own name holds (`path_component` writes `%` only before two hex
        digits or `~`)."""
        return path_component(an_id) + (f"%p{int(part)}" if part != 1 else "") + ".html"

    def _to(self, folder: str, route: str, an_id: str, spec: str | None, depth: int, part: int = 1) -> str:
        if self.static:
            return "../" * depth + f"{folder}/{url_part(self.page_file(an_id, part))}"
        return (f"/{route}?id={url_part(an_id)}" + (f"&spec={url_part(spec)}" if spec else "")
                + (f"&page={int(part)}" if part != 1 else ""))

    def run(self, run_id: str, spec: str | None, depth: int = 0, part: int = 1) -> str:
        return self._to("runs", "run", run_id, spec, depth, part)

    def episode(self, episode_id: str, spec: str | None, depth: int = 0) -> str:
        return self._to("episodes", "episode", episode_id, spec, depth)

    def index(self, depth: int = 0) -> str:
        return ("../" * depth + "index.html") if self.static else "/"

    def train(self, run_id: str, spec: str | None, depth: int = 0) -> str:
        """A train run's page: its curves, evals, config, policies and steps."""
        return self._to("train", "train", run_id, spec, depth)

    def evals(self, run_id: str, spec: str | None, depth: int = 0) -> str:
        """A train run's evals compared task by task."""
        return self._to("evals", "evals", run_id, spec, depth)

    @staticmethod
    def trained_file(run_id: str, step: int) -> str:
        """The exported page of what step `step` of a train run trained on: `%sN` after the run's name, which no
        id's own name holds (as `%pN`)."""
        return path_component(run_id) + f"%s{int(step)}.html"

    def trained(self, run_id: str, step: int, spec: str | None, depth: int = 0) -> str:
        """The episodes step `step` of train run `run_id` trained on."""
        if self.static:
            return "../" * depth + f"trained/{url_part(self.trained_file(run_id, step))}"
        return (f"/trained?id={url_part(run_id)}&step={int(step)}" + (f"&spec={url_part(spec)}" if spec else ""))


class Pages:
    """The viewer's pages over `lake` at `snapshot`, rewards under spec `spec` (a spec id; None: none): each
    method reads one page's rows and renders them with render's functions (the export renders with the
    same functions from rows it reads in bulk)."""

    def __init__(self, lake, snapshot: int, spec: str | None, links: Links,
                 specs: list[tuple[str, str]] | None = None):
        self.lake, self.snapshot, self.spec, self.links = lake, snapshot, spec, links
        self._specs = specs  # the lake's specs at `snapshot`, if the caller has read them (they cannot change)

    def q(self, sql: str, params: list | None = None):
        return self.lake.query(sql, params, snapshot=self.snapshot)

    def specs(self) -> list[tuple[str, str]]:
        """The lake's (spec id, name) pairs at the snapshot, read once (a page asks twice: the check, its line)."""
        if self._specs is None:
            self._specs = reward_spec_names(self.lake, snapshot=self.snapshot)
        return self._specs

    def check_spec(self, spec: str | None) -> None:
        """A spec id someone asked for (a query parameter, --spec) must be one the lake has: an unknown one
        would show every reward as empty without a word."""
        if spec is not None and spec not in {sid for sid, _ in self.specs()}:
            raise TrajlakeError(f"no reward spec {spec!r} at snapshot {self.snapshot} "
                                "(trajlake sql \"SELECT spec_id, name FROM reward_specs\" lists them)")

    def spec_line(self, make_link) -> str:
        """Which spec the rewards are under: exported, its id; served, a link to each spec's same page."""
        if self.links.static:
            return f"<p class=\"muted\">rewards under spec {esc(self.spec or 'none')}</p>"
        items = [link(make_link(sid), f"{name} ({sid})") if sid != self.spec else f"<b>{esc(f'{name} ({sid})')}</b>"
                 for sid, name in self.specs()]
        return f"<p>rewards under spec: {' | '.join(items) or 'none scored yet'}</p>"

    def runs(self) -> str:
        return self.runs_from(self.q(RUNS_SQL).to_dicts(), sparks(self.lake, self.snapshot))

    def runs_from(self, rows: list[dict], lines: dict) -> str:
        """The run list from rows already read (RUNS_SQL's) and the train runs' sparkline values (`sparks`)."""
        return runs_page(rows, self.snapshot, self.links, self.spec, lines)

    # ---- train runs and their evals (train_pages) ------------------------------------------------------------
    def _train_view(self, run_id: str):
        view = read_train(self.lake, self.snapshot, [run_id]).get(run_id)
        if view is None:
            raise TrajlakeError(f"no train run {run_id!r} at snapshot {self.snapshot}")
        return view

    def train(self, run_id: str) -> str:
        """Train run `run_id`'s page: curves, evals, config, policies, steps."""
        return self.train_from(self._train_view(run_id))

    def train_from(self, view) -> str:
        return train_page(view, self.links, self.spec)

    def evals(self, run_id: str) -> str:
        """Train run `run_id`'s evals compared on the same tasks."""
        return self.evals_from(self._train_view(run_id))

    def evals_from(self, view) -> str:
        return train_evals_page(view, self.links, self.spec)

    def eval_pair(self, a: str, b: str) -> str:
        """Eval runs `a` and `b` compared on the tasks they share (served only)."""
        try:
            groups = eval_pair(self.lake, self.snapshot, a, b)
        except KeyError as e:
            raise TrajlakeError(f"no eval run {e.args[0]!r} with played episodes at snapshot {self.snapshot}") from None
        return pair_page(a, b, groups, self.links, self.spec)

    def trained(self, run_id: str, step: int) -> str:
        """The episodes step `step` of train run `run_id` trained on (the first RUN_PAGE_ROWS by id)."""
        got = self.q("SELECT coalesce(len(list_distinct(episode_ids)), 0) AS listed FROM train_steps "
                     "WHERE run_id = ? AND step = ?", [run_id, step])
        if not got.height:
            raise TrajlakeError(f"no step {step} of train run {run_id!r} at snapshot {self.snapshot}")
        rows = self.q(TRAINED_SQL, [self.spec, run_id, step, RUN_PAGE_ROWS]).to_dicts()
        sources = [(r["from_run"], int(r["episodes"])) for r in self.q(TRAINED_FROM_SQL, [[run_id], step]).to_dicts()]
        return self.trained_from(run_id, step, rows, total=rows[0]["total"] if rows else 0,
                                 listed=int(got["listed"][0]), sources=sources)

    def trained_from(self, run_id: str, step: int, rows: list[dict], *, total: int, listed: int,
                     sources: list) -> str:
        return trained_page(run_id, step, rows, total=total, listed=listed, sources=sources, links=self.links,
                            spec=self.spec, spec_line=self.spec_line(lambda s: self.links.trained(run_id, step, s)))

    def run(self, run_id: str, part: int = 1) -> str:
        """Part `part` (from 1) of run `run_id`'s episodes: RUN_PAGE_ROWS of them, by id."""
        if part < 1:
            raise TrajlakeError(f"no page {part} of run {run_id!r}: pages count from 1")
        rows = self.q(EPISODES_SQL, [self.spec, run_id, RUN_PAGE_ROWS, (part - 1) * RUN_PAGE_ROWS]).to_dicts()
        if not rows:
            if part > 1 and self.q("SELECT 1 FROM episodes WHERE run_id = ? LIMIT 1", [run_id]).height:
                raise TrajlakeError(f"no page {part} of run {run_id!r} at snapshot {self.snapshot}")
            if part == 1 and (view := read_train(self.lake, self.snapshot, [run_id]).get(run_id)) is not None:
                return self.train_from(view)  # a train run has no episodes of its own: its page is its train page
            raise TrajlakeError(f"no episodes in run {run_id!r} at snapshot {self.snapshot}")
        held_out = self._held_out(run_id) if rows[0]["run_kind"] == "eval" else ""
        return self.run_from(run_id, rows, total=rows[0]["total"], part=part, held_out=held_out)

    def run_from(self, run_id: str, rows: list[dict], *, total: int, part: int, held_out: str) -> str:
        """A run page from rows already read (EPISODES_SQL's columns)."""
        return run_page(run_id, rows, total=total, part=part, links=self.links, spec=self.spec, held_out=held_out,
                        spec_line=self.spec_line(lambda s: self.links.run(run_id, s, part=part)))

    def _held_out(self, run_id: str) -> str:
        """Eval run `run_id`'s held-out summary (`held_out_block`)."""
        return held_out_block(eval_contamination(self.lake, [run_id], snapshot=self.snapshot).to_dicts())

    def _episode(self, episode_id: str, spec: str | None) -> str:
        """One episode's block (header and turns) under `spec`."""
        rows = self.q(EPISODE_PAGE_SQL, [spec, episode_id]).to_dicts()
        if not rows:
            raise TrajlakeError(f"no episode {episode_id!r} at snapshot {self.snapshot}")
        ep = rows[0]
        turns = ep["turn_rows"] or []
        rewards = rewards_from_spans((s["position"], s["length"], s["reward"]) for s in ep["span_rows"] or ())
        tok = _tokenizer_for(self.lake, self.snapshot, ep["run_id"], ep["policy_id"])
        return episode_block(episode_id, ep, turns, rewards, None if tok is None else TokenText(tok), spec)

    def episode(self, episode_id: str) -> str:
        return self.episode_from(episode_id, self._episode(episode_id, self.spec))

    def episode_from(self, episode_id: str, block: str) -> str:
        """An episode page around its block (`episode_block` under this spec)."""
        return episode_page(episode_id, block, self.links,
                            self.spec_line(lambda s: self.links.episode(episode_id, s)))

    def compare(self, a: str, b: str, spec_b: str | None = None) -> str:
        """Episodes `a` and `b` side by side (the same spec), or `a` under this spec and `spec_b`."""
        self.check_spec(spec_b)
        left = self._episode(a, self.spec)
        right = self._episode(b, spec_b or self.spec)
        return page(f"compare {a} {b}", f"<p>{link(self.links.index(), 'runs')}</p><div class=\"side\">"
                    f"<div id=\"left\">{left}</div><div id=\"right\">{right}</div></div>")

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


__all__ = ["EPISODES_SQL", "EPISODE_PAGE_SQL", "EPISODE_SQL", "RUNS_SQL", "RUN_PAGE_ROWS", "TURN_COLUMNS", "Links",
           "Pages", "shade"]
