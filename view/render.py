"""The viewer's page renderers: pure functions from rows already read to HTML, no lake access.

`pages.Pages` (served pages, and any one page) reads one page's rows and calls these; the static
export (`export`) reads the rows of every page in a few bulk queries and calls the very same
functions, so a page is the same bytes whichever way it was read. Every value from the lake goes through
`esc`, every id in a link through the `links` object (`pages.Links`), as markup says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from trajlake.evaluate.metrics import held_out_label
from trajlake.store.reads import NO_OUTCOME
from trajlake.view.charts import sparkline
from trajlake.view.markup import attrs, esc, link, page

#: the most episodes one run page lists; a longer run is split into parts (`?page=N`, `<run>%pN.html`), so
#: a run of 100,000 episodes answers as fast as one of 2,000 and its page stays one a browser opens at once
RUN_PAGE_ROWS = 2000

#: the run page's columns: (header, data-* key, sorted as a number)
RUN_COLUMNS = [("episode", "id", False), ("env", "env", False), ("policy", "policy", False), ("task", "task", False),
               ("sample", "sample", True), ("status", "status", False), ("success", "success", False),
               ("env reward", "envreward", True), ("turns", "turns", True), ("agent tokens", "tokens", True),
               ("reward", "reward", True)]


def _rate(value, wins, n) -> str:
    """A success rate with what it is over ("0.50 (2 of 4 episodes)"); "none" when nothing is under it."""
    return "none" if value is None or not n else f"{value:.2f} ({wins} of {n} episodes)"


def shade(reward: float, scale: float) -> str:
    """A background for a token's reward: green for a positive one, red for a negative, stronger the larger."""
    if not reward or not scale:
        return "transparent"
    a = min(1.0, abs(reward) / scale) * 0.75 + 0.1
    return f"rgba(0,160,60,{a:.2f})" if reward > 0 else f"rgba(220,40,40,{a:.2f})"


class TokenText:
    """One reply token as escaped page text (`esc(tok.decode([id]))`), remembered per id: a tokenizer's
    decode call costs tens of microseconds, and an export decodes the same few thousand ids millions of times."""

    def __init__(self, tokenizer):
        self.tokenizer, self._seen = tokenizer, {}

    def __call__(self, token: int) -> str:
        text = self._seen.get(token)
        if text is None:
            text = self._seen[token] = esc(self.tokenizer.decode([token]))
        return text


def rewards_from_spans(spans: Iterable[tuple[int, int, float]]) -> dict[int, float]:
    """position -> reward from `reward_spans` rows (position, length, reward): their expansion, which is exactly
    the `token_rewards` view (schemas/views.py), read as one row per agent segment instead of one per token."""
    out: dict[int, float] = {}
    for position, length, reward in spans:
        for p in range(position, position + length):
            out[p] = reward
    return out


#: the run list's groups, in order (a kind not named here follows, in name order)
KIND_ORDER = ("train", "eval", "collect", "import")


def _spark_cell(run_id: str, sparks: dict) -> str:
    """A train run's main metric as a sparkline with its last value ('' when it has none)."""
    if run_id not in sparks:
        return ""
    label, points = sparks[run_id]
    values = [(x, y) for x, y in points if y is not None]
    if not values:
        return ""
    first, last = values[0], values[-1]
    title = f"{label} at step {first[0]:g}: {first[1]:.4g}; at step {last[0]:g}: {last[1]:.4g} ({len(points)} steps)"
    return sparkline(points, label=title) + f" <span class=\"muted\">{esc(label)} {last[1]:.3g}</span>"


def runs_page(rows: list[dict], snapshot: int, links, spec: str | None, sparks: dict | None = None) -> str:
    """The index: every run (RUNS_SQL's rows), grouped by kind, train runs first, each followed by the runs
    under it (`parent_run_id`: a train run's iteration collect runs and in-training evals); a train run (of kind
    train, or with steps) links to its train page with a sparkline of its main metric (`sparks`: run id ->
    (label, [(step, value)])), another run with episodes to its episodes."""
    sparks = sparks or {}
    ids = {r["run_id"] for r in rows}
    children: dict[str, list[dict]] = {}
    top = []
    for r in rows:
        parent = r["parent_run_id"]
        if parent in ids and parent != r["run_id"]:
            children.setdefault(parent, []).append(r)
        else:
            top.append(r)
    is_train = lambda r: r["kind"] == "train" or bool(r.get("steps"))  # noqa: E731
    groups: dict[str, list[dict]] = {}
    for r in top:
        groups.setdefault("train" if is_train(r) else str(r["kind"]), []).append(r)
    order = [k for k in KIND_ORDER if k in groups] + sorted(k for k in groups if k not in KIND_ORDER)
    head = "".join(f"<th>{t}</th>" for t in ("run", "kind", "status", "parent", "episodes", "success", "envs",
                                             "policies", "started", "curve"))
    body = [f"<h1>Runs</h1><p class=\"muted\">lake snapshot {esc(snapshot)}; {len(rows)} runs</p>",
            f"<table id=\"runs\"><tr>{head}</tr>"]
    seen: set[str] = set()

    def add(r: dict, depth: int) -> None:
        if r["run_id"] in seen:  # a parent cycle a hand-edited lake may hold
            return
        seen.add(r["run_id"])
        if is_train(r):
            name = link(links.train(r["run_id"], spec), r["run_id"])
        else:
            name = link(links.run(r["run_id"], spec), r["run_id"]) if r["episodes"] else esc(r["run_id"])
        cells = [esc(r[k]) for k in ("kind", "status", "parent_run_id", "episodes", "success_rate", "envs",
                                     "policies", "started_at")]
        if r["kind"] == "import" and r["episodes"] and r["success_rate"] is None:  # a file with no success flag
            cells[4] = esc(NO_OUTCOME)
        cls = attrs(class_=f"child depth-{min(depth, 3)}") if depth else ""
        mark = "&#8627; " if depth else ""
        body.append(f"<tr{cls}{attrs(data_run=r['run_id'])}><td>{mark}{name}</td>"
                    + "".join(f"<td>{c}</td>" for c in cells)
                    + f"<td class=\"curve\">{_spark_cell(r['run_id'], sparks)}</td></tr>")
        for c in children.get(r["run_id"], []):
            add(c, depth + 1)

    for kind in order:
        body.append(f"<tr class=\"group\"><th colspan=\"10\">{esc(kind)} runs ({len(groups[kind])})</th></tr>")
        for r in groups[kind]:
            add(r, 0)
    for r in rows:  # a run in a parent cycle has no top: listed last, as it is
        if r["run_id"] not in seen:
            add(r, 0)
    return page("trajlake runs", "".join(body) + "</table>")


def _parts_line(run_id: str, part: int, shown: int, total: int, links, spec: str | None, depth: int) -> str:
    """Where this part of a long run is, with links to the parts before and after ('' for a run on one page)."""
    if total <= RUN_PAGE_ROWS:
        return ""
    first = (part - 1) * RUN_PAGE_ROWS + 1
    parts = -(-total // RUN_PAGE_ROWS)
    nav = [link(links.run(run_id, spec, depth, part - 1), "previous") if part > 1 else "",
           link(links.run(run_id, spec, depth, part + 1), "next") if part < parts else ""]
    return (f"<p class=\"muted\" id=\"parts\">showing episodes {first:,} to {first + shown - 1:,} of {total:,} "
            f"(by id; part {part} of {parts}: the filters and sorting apply to these) "
            + " ".join(n for n in nav if n) + "</p>")


def episode_table(rows: list[dict], links, spec: str | None, depth: int) -> str:
    """The filters and the table of episodes (EPISODES_SQL's columns; the page's script filters and sorts
    them), each linked to its page."""
    envs = sorted({r["env"] for r in rows if r["env"]})
    # the script attaches the sort listeners to these links (no onclick=: the CSP forbids it)
    head = "".join(f"<th>{link('#', t, data_sort=k, data_num=int(num))}</th>" for t, k, num in RUN_COLUMNS)
    lines = []
    for r in rows:
        # each value escaped once, for its data-* attribute and its cell alike (what attrs and esc write)
        data = {"id": esc(r["episode_id"]), "env": esc(r["env"]), "policy": esc(r["policy_id"]),
                "task": esc(r["task_id"]), "sample": esc(r["sample_index"]), "status": esc(r["status"]),
                "success": esc(str(r["success"]).lower()), "envreward": esc(r["env_reward"]),
                "turns": esc(r["num_turns"]), "tokens": esc(r["num_agent_tokens"]), "reward": esc(r["reward"])}
        first = link(links.episode(r["episode_id"], spec, depth), r["episode_id"][:8], title=r["episode_id"])
        lines.append("<tr" + "".join(f' data-{k}="{v}"' for k, v in data.items()) + f"><td>{first}</td>"
                     + "".join(f"<td>{data[k]}</td>" for _, k, _ in RUN_COLUMNS[1:]) + "</tr>")
    env_options = "".join(f"<option>{esc(e)}</option>" for e in envs)
    filters = ("<form id=\"filters\" class=\"filters\">env <select name=\"env\"><option value=\"\">all</option>"
               f"{env_options}</select> policy <input name=\"policy\"> success <select name=\"success\"><option "
               "value=\"\">all</option><option>true</option><option>false</option></select> reward from <input "
               "name=\"min_reward\"> to <input name=\"max_reward\"> "
               f"&nbsp;<span id=\"shown\">{len(rows)}</span> of {len(rows)} shown</form>")
    return filters + f"<table id=\"episodes\"><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def run_page(run_id: str, rows: list[dict], *, total: int, part: int, links, spec: str | None, held_out: str,
             spec_line: str) -> str:
    """One part of a run's episodes (EPISODES_SQL's rows: at most RUN_PAGE_ROWS of `total`), with its
    held-out summary and spec line (HTML already built) above the filters."""
    depth = 1 if links.static else 0
    body = (f"<p>{link(links.index(depth), 'runs')}</p><h1>Run {esc(run_id)}</h1>" + held_out + spec_line
            + _parts_line(run_id, part, len(rows), total, links, spec, depth) + episode_table(rows, links, spec, depth))
    return page(f"run {run_id}", body)


def held_out_block(rows: list[dict]) -> str:
    """An eval run's summary of whether its number is held out, from its `eval_contamination` rows (per env and
    split): the evaluated policy's tasks that share a task id or goal with what its lineage trained on, its
    success and the success on the clean tasks, labelled by `held_out_label`. A run whose tasks are not all
    clean opens with that label in a banner, so its success is not read as a held-out number."""
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


def _reply(response: list[int], position: int, rewards: dict[int, float], scale: float,
           token_text: Callable[[int], str], by_reward: dict) -> str:
    """A reply's tokens, each a span with its position, reward and shade. The numbers are written without
    `esc`: str() of an int or a float holds no character it would change (each span costs microseconds, and
    an export writes millions); the token's text is escaped by `token_text`. `by_reward` keeps the episode's
    text around each reward value (a segment's tokens share one; rewards of 0 are never stored, so 0.0 is
    always the default's, never a -0.0 that would print otherwise)."""
    spans = []
    for k, token in enumerate(response):
        r = rewards.get(position + k, 0.0)
        around = by_reward.get(r)
        if around is None:
            # the colour goes in data-shade for the script to apply: the CSP forbids style= attributes
            around = by_reward[r] = (f"\" data-reward=\"{r}\" title=\"token ",
                                     f", reward {r:g}\" data-shade=\"{shade(r, scale)}\">")
        spans.append(f"<span class=\"tok\" data-position=\"{position + k}{around[0]}{int(token)}{around[1]}"
                     f"{token_text(token)}</span>")
    return "".join(spans)


def episode_block(episode_id: str, ep: dict, turns: list[dict], rewards: dict[int, float],
                  token_text: Callable[[int], str] | None, spec: str | None) -> str:
    """One episode's block (header and turns) under `spec`: `ep` its EPISODE_SQL row, `turns` its TURNS_SQL
    rows in turn order, `rewards` its token rewards by position, `token_text` its tokenizer's (a TokenText;
    None: replies are shown as text)."""
    scale = max((abs(v) for v in rewards.values()), default=0.0)
    adv = ep["advantage"]
    head = (f"<h2>Episode {esc(episode_id)}</h2><p>env {esc(ep['env'])}, task {esc(ep['task_id'])}, policy "
            f"{esc(ep['policy_id'])}, run {esc(ep['run_id'])}; status {esc(ep['status'])}, success "
            f"<b id=\"success\">{esc(ep['success'])}</b>, env reward {esc(ep['env_reward'])}; reward "
            f"<b{attrs(id='reward', data_spec=spec)}>{esc(ep['reward'])}</b> under spec {esc(spec or 'none')}"
            + (f", advantage <b id=\"advantage\">{adv:.3f}</b> (group of {esc(ep['group_size'])}: reward minus "
               "the group's mean, over its std)" if adv is not None else "") + "</p>"
            + (f"<p class=\"instruction\">instruction: {esc(ep['instruction'])}</p>" if ep["instruction"] else "")
            + (f"<p class=\"error\">error: {esc(ep['error'])}</p>" if ep["error"] else ""))
    blocks, position, by_reward = [], 0, {}
    for t in turns:
        a = t["response_token_ids"] or ()
        # the store's count of the prompt ids (0 for none): the positions token_rewards gives are counted so
        position += t["num_prompt_tokens"] or 0
        reply = (_reply(a, position, rewards, scale, token_text, by_reward) if token_text is not None and a
                 else esc(t["action_text"]))
        position += len(a)
        blocks.append(f"<div{attrs(class_='turn', data_turn=t['turn'])}><b>turn {esc(t['turn'])}</b>"
                      f"<div class=\"obs\">{esc(t['observation'])}</div><div class=\"reply\">{reply}</div><p>"
                      f"action <code>{esc(t['action'])}</code>, format ok {esc(t['format_ok'])}, step reward "
                      f"{esc(t['step_reward'])}, done {esc(t['done'])}, info <code>{esc(t['info'] or '{}')}</code>"
                      "</p></div>")
    return head + "".join(blocks)


def episode_page(episode_id: str, block: str, links, spec_line: str) -> str:
    """An episode's page: the way back to the runs, the spec line, and its block (`episode_block`)."""
    depth = 1 if links.static else 0
    return page(f"episode {episode_id}", f"<p>{link(links.index(depth), 'runs')}</p>" + spec_line + block)


__all__ = ["KIND_ORDER", "RUN_PAGE_ROWS", "TokenText", "episode_block", "episode_page", "episode_table",
           "held_out_block", "rewards_from_spans", "run_page", "runs_page", "shade"]
