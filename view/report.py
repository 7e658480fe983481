"""`build_report`: one self-contained HTML page (plus PNG plots beside it) over everything in a lake.

Sections: the runs in the store, learning curves of train runs, KL and entropy over training, reward
distributions per spec, turns per episode per env, a side-by-side table of the policies' eval runs, and per eval
run whether its number is held out (the `eval_contamination` view: how many of its tasks the evaluated policy's
lineage trained on, and the success on the clean rest, labelled `clean` or `NOT CLEAN: K of N tasks trained on`).
Every number is the result of one query over the store, read at one pinned snapshot, and the page shows
each query next to its plot or table, so `trajlake sql -s SNAPSHOT "..."` gives the same numbers back.
A section with no data yet says what produces it instead of plotting.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import re
from pathlib import Path
from urllib.parse import quote

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trajlake.core.atomic import atomic_output, write_text_atomically
from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_list
from trajlake.evaluate.metrics import held_out_label
from trajlake.store import Lake
from trajlake.view.train_data import curve_table, read_steps, steps_query, train_ids

# `{runs}` becomes a filter on the run ids given to build_report (nothing when every run is shown).
# Episodes that ended in an env error (status 'error': a dead env server, not the policy) are left out of
# every rate and mean below and counted on their own (env_errors).
RUNS_SQL = """
SELECT r.kind, count(DISTINCT r.run_id) AS runs,
       count(DISTINCT r.run_id) FILTER (WHERE r.status = 'finished') AS finished,
       count(e.episode_id) FILTER (WHERE e.status IS DISTINCT FROM 'error') AS episodes,
       round(avg(e.success::INT) FILTER (WHERE e.status IS DISTINCT FROM 'error'), 3) AS success_rate,
       count(e.episode_id) FILTER (WHERE e.status = 'error') AS env_errors
FROM runs r LEFT JOIN episodes e USING (run_id)
GROUP BY r.kind ORDER BY r.kind"""

# The train runs' curves are the viewer's read model (view/train_data.py: read_steps, metric); the page shows the
# query it runs (steps_query) and these metrics of each step: key -> the column plotted
LEARNING_METRICS = {"success_mean": "success", "reward_mean": "reward", "eval_success": "eval_success"}
KL_METRICS = {"kl": "kl", "entropy": "entropy", "pg_clipfrac": "clip_fraction"}
#: the sections read from train runs' steps rather than by a query of their own
CURVE_SECTIONS = {"learning": LEARNING_METRICS, "kl": KL_METRICS}

REWARDS_SQL = """
SELECT coalesce(s.name, '?') || ' (' || left(r.spec_id, 8) || ')' AS spec, r.total
FROM episode_rewards r LEFT JOIN reward_specs s USING (spec_id)
WHERE r.total IS NOT NULL
ORDER BY s.created_at, spec"""

TURNS_SQL = """
SELECT env, num_turns, count(*) AS episodes
FROM episodes
WHERE num_turns IS NOT NULL AND status IS DISTINCT FROM 'error'
GROUP BY env, num_turns ORDER BY env, num_turns"""

POLICIES_SQL = """
WITH ev AS (
    SELECT e.*, e.status IS DISTINCT FROM 'error' AS played FROM episodes e JOIN runs r USING (run_id)
    WHERE r.kind = 'eval'{runs}
), per_episode AS (
    SELECT episode_id, count(*) AS turns, count(*) FILTER (WHERE NOT format_ok) AS format_errors,
           sum(num_prompt_tokens + num_response_tokens) AS tokens
    FROM turns WHERE episode_id IN (SELECT episode_id FROM ev WHERE played) GROUP BY episode_id
)
SELECT ev.env, ev.policy_id, count(*) FILTER (WHERE ev.played) AS episodes,
       round(avg(ev.success::INT) FILTER (WHERE ev.played), 3) AS success_rate,
       round(avg(ev.env_reward) FILTER (WHERE ev.played), 3) AS mean_env_reward,
       round(avg(ev.num_turns) FILTER (WHERE ev.played), 2) AS mean_turns,
       round(sum(p.format_errors) / sum(p.turns), 3) AS format_error_rate,
       round(avg(p.tokens), 1) AS tokens_per_episode,
       round(avg(ev.num_agent_tokens) FILTER (WHERE ev.played), 1) AS agent_tokens_per_episode,
       count(*) FILTER (WHERE NOT ev.played) AS env_errors
FROM ev LEFT JOIN per_episode p USING (episode_id)
GROUP BY ev.env, ev.policy_id
ORDER BY ev.env, success_rate DESC, ev.policy_id"""

# The eval runs of the policies section, each with its contamination (schemas/lineage_views.py); `held_out` is
# added to each row by the renderer from contaminated_tasks and tasks (metrics.held_out_label).
CONTAMINATION_SQL = """
SELECT c.eval_run, c.policy_id, c.env, c.split, c.tasks, c.contaminated_tasks, c.episodes, c.success_rate,
       c.clean_tasks, c.clean_episodes, c.clean_success_rate
FROM eval_contamination c JOIN runs r ON r.run_id = c.eval_run{runs}
ORDER BY c.env, c.policy_id, c.eval_run, c.split"""

#: id -> (title, what it shows, SQL (None: a curve section), what produces its data); the order of the page.
SECTIONS: dict[str, tuple[str, str, str | None, str]] = {
    "runs": ("Runs in the store", "Runs of each kind, with their episodes (those that ended in an env error are "
             "counted apart, as env_errors, and left out of the success rate).", RUNS_SQL,
             "any run: `trajlake collect`, `trajlake import-agentgym`, `trajlake train` or `trajlake evaluate`"),
    "learning": ("Learning curves", "Per train run, over steps (policy versions): the success rate and mean "
                 "reward of each iteration's batch, and held-out eval success (markers) where it was measured.",
                 None, "train steps with success/reward metrics, from `trajlake train` (GRPO or PPO)"),
    "kl": ("KL and entropy over training", "Per train run: KL to the reference policy, mean token entropy of "
           "the policy and the share of clipped tokens, per step.",
           None, "train steps with kl/entropy metrics, from `trajlake train` (GRPO or PPO)"),
    "rewards": ("Reward distributions per spec", "Episode totals under each reward spec (name and id).",
                REWARDS_SQL, "episode rewards, from `trajlake rewards --spec SPEC.toml`"),
    "turns": ("Turns per episode", "How many turns episodes took, per env (env errors left out).", TURNS_SQL,
              "episodes, from `trajlake collect` or `trajlake evaluate`"),
    "policies": ("Policies side by side (eval runs)", "Episodes of eval runs, per env and policy: success "
                 "rate, mean env reward, mean turns, share of replies without a valid action, and tokens "
                 "(prompt + response, and agent tokens alone) per episode; episodes that ended in an env error are "
                 "left out of these and counted as env_errors. Whether each eval run's tasks are held out from "
                 "what its policy trained on: the next section.",
                 POLICIES_SQL, "eval runs (runs.kind = 'eval'), from `trajlake evaluate`"),
    "contamination": ("Held out? (contamination of eval runs)", "Per eval run: how many of its tasks share a task "
                      "id or a goal with an episode the evaluated policy's lineage trained on (its own train run up "
                      "to its step and its ancestors'), the success on all tasks and on the clean ones alone. "
                      "held_out reads clean when no task was trained on; a success rate labelled NOT CLEAN is "
                      "not a held-out number (its clean_success_rate is). Env errors are left out.",
                      CONTAMINATION_SQL, "eval runs (runs.kind = 'eval'), from `trajlake evaluate`"),
}
#: the sections the `runs` argument filters: the keyword their filter starts with, and the columns it checks
FILTERED = {"policies": ("AND", ("r.run_id", "r.parent_run_id")),
            "contamination": ("WHERE", ("r.run_id", "r.parent_run_id"))}

#: per section: the episodes at its extremes, each plot's worst and best, linked to the viewer's pages
#: (label, spec_id, worst episode, best episode)
EXTREMES = {
    "rewards": """SELECT s.name || ' (' || r.spec_id || ')' AS label, r.spec_id,
                  arg_min(r.episode_id, r.total) AS worst, arg_max(r.episode_id, r.total) AS best
                  FROM episode_rewards r JOIN reward_specs s USING (spec_id) GROUP BY ALL ORDER BY 1""",
    "turns": """SELECT env AS label, NULL AS spec_id,
                arg_max(episode_id, num_turns) FILTER (WHERE NOT success) AS worst,
                arg_min(episode_id, num_turns) FILTER (WHERE success) AS best
                FROM episodes WHERE status IS DISTINCT FROM 'error' GROUP BY env ORDER BY 1""",
    "policies": """SELECT e.policy_id AS label, NULL AS spec_id,
                   arg_min(e.episode_id, coalesce(e.success::INT, 0)) AS worst,
                   arg_max(e.episode_id, coalesce(e.success::INT, 0)) AS best
                   FROM episodes e JOIN runs r USING (run_id) WHERE r.kind = 'eval' {runs}
                   AND e.status IS DISTINCT FROM 'error' GROUP BY 1 ORDER BY 1""",
}
#: where `trajlake view` serves its pages by default
VIEWER_URL = "http://127.0.0.1:8765/"

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: 85%; }
table { border-collapse: collapse; font-size: 90%; } th, td { border: 1px solid #ccc; padding: .25em .6em; }
th { background: #f0f0f0; } td.num { text-align: right; } img { max-width: 100%; }
.empty { color: #8a6d3b; background: #fcf8e3; padding: .6em; } .meta { color: #666; }
td.notclean { color: #a00; font-weight: bold; background: #fdecea; } td.clean { color: #2a7a2a; }
"""

# The page runs no script and loads only its own plots: its policy says so, so that a value from the lake that
# ever slipped past html.escape still could not run or load anything. ('self' plus file: because the page is
# most often opened from disk.)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'self' file:; base-uri 'none'; "
       "form-action 'none'")


def _extremes(lake: Lake, snap: int, key: str, viewer_url: str, runs: list[str]) -> str:
    """The links from a section to the viewer's pages of its worst and best episodes ('' when it has none);
    `runs` filters the sections the run filter applies to, as their plots."""
    if key not in EXTREMES:
        return ""
    items = []
    sql = EXTREMES[key].replace("{runs}", _run_filter(runs, *FILTERED.get(key, ("", ()))))
    for label, spec, worst, best in lake.query(sql, snapshot=snap).rows():
        # ids and spec ids come from data: each one URL component, then the whole URL escaped as an attribute
        # (a query parameter, not a path segment: a browser collapses an id `..` in a path even percent-encoded)
        q = f"&spec={quote(spec, safe='')}" if spec else ""
        links = [f'<a href="{html.escape(viewer_url + "episode?id=" + quote(eid, safe="") + q)}">{what}</a>'
                 for what, eid in (("worst", worst), ("best", best)) if eid]
        if links:
            items.append(f"{html.escape(str(label))}: {' · '.join(links)}")
    if not items:
        return ""
    return (f'<p class="meta">episodes in the viewer (<code>trajlake view</code>): {"; ".join(items)}</p>')


def build_report(lake: Lake, out_dir, runs: list[str] | None = None, viewer_url: str = VIEWER_URL) -> Path:
    """Write `out_dir/index.html` and its PNG plots; returns the HTML file's path.

    `runs` restricts the train-run plots and the eval table to those run ids (an eval run also counts when
    its parent run is listed); None or empty shows every run. The reward, turn and policy sections link their
    worst and best episodes to the viewer's pages at `viewer_url` (`trajlake view`'s default address).
    Raises TrajlakeError for an out_dir that cannot be a folder and for run ids the lake does not have.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TrajlakeError(f"report folder {out} is a file; pass a folder (it is created if missing)")
    snap = lake.current_snapshot()
    runs = list(dict.fromkeys([runs] if isinstance(runs, str) else runs or []))
    if runs:
        known = set(lake.query(f"SELECT run_id FROM runs WHERE run_id IN ({sql_list(runs)})", snapshot=snap)["run_id"])
        unknown = [r for r in runs if r not in known]
        if unknown:
            raise TrajlakeError(f"unknown run id(s): {', '.join(unknown)} (list them with "
                                "trajlake sql \"SELECT run_id, kind, started_at FROM runs ORDER BY started_at\")")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrajlakeError(f"cannot create report folder {out}: {e.strerror or e}") from None

    parts = []
    train_runs = runs or train_ids(lake, snap)
    steps = read_steps(lake, snap, train_runs)
    for key, (title, what, sql, producer) in SECTIONS.items():
        if key in CURVE_SECTIONS:
            sql = steps_query(train_runs)
            df = pl.DataFrame(curve_table(steps, CURVE_SECTIONS[key]),
                              schema={"run_id": pl.String, "step": pl.Int64,
                                      **dict.fromkeys(CURVE_SECTIONS[key].values(), pl.Float64)})
        else:
            sql = sql.strip().replace("{runs}", _run_filter(runs, *FILTERED.get(key, ("", ()))))
            df = lake.query(sql, snapshot=snap)
        (out / f"{key}.png").unlink(missing_ok=True)  # a plot left by an earlier report into this folder
        body = RENDER[key](df, out / f"{key}.png") if df.height else None
        if body is None:
            body = f'<p class="empty">no data yet: {_code(html.escape(producer))}</p>'
        body += _extremes(lake, snap, key, viewer_url, runs) if df.height else ""
        parts.append(f'<section id="{key}"><h2>{html.escape(title)}</h2><p>{html.escape(what)}</p>\n{body}\n'
                     f"<p class=\"meta\">query:</p><pre>{html.escape(sql)}</pre></section>")
    nav = " · ".join(f'<a href="#{k}">{html.escape(t[0])}</a>' for k, t in SECTIONS.items())
    shown = ", ".join(runs) if runs else "all"
    when = utc_now().strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{html.escape(CSP)}\">"
            "<title>trajlake report</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>trajlake report</h1>\n"
            f"<p class=\"meta\">Lake snapshot {snap} (rerun any query with <code>trajlake sql -s {snap} \"...\""
            f"</code>) · runs: {html.escape(shown)} · generated {when}</p>\n<nav>{nav}</nav>\n"
            + "\n".join(parts) + "\n</body></html>\n")
    index = out / "index.html"
    write_text_atomically(index, page)
    return index


def _code(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


# ---- SQL helpers ---------------------------------------------------------------------------------


def _run_filter(runs: list[str], keyword: str, columns: tuple[str, ...]) -> str:
    if not runs or not columns:
        return ""
    lits, sep = sql_list(runs), "\n" if keyword == "WHERE" else " "
    return f"{sep}{keyword} (" + " OR ".join(f"{c} IN ({lits})" for c in columns) + ")"


# ---- renderers: a DataFrame -> HTML (None when nothing in it can be shown) -----------------------------
def _table(df: pl.DataFrame, _png: Path | None = None, classes: dict | None = None) -> str:
    """`df` as an HTML table, every text escaped; `classes` (column -> value -> CSS class, one of STYLE's) marks
    the cells of a column by their value."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    marks = [(classes or {}).get(c) for c in df.columns]
    rows = []
    for row in df.iter_rows():
        cells = "".join(
            f'<td class="num">{v}</td>' if isinstance(v, int | float) and not isinstance(v, bool)
            else f'<td class="{html.escape(mark(v))}">{html.escape(str(v))}</td>' if mark and v is not None
            else f"<td>{html.escape('' if v is None else str(v))}</td>"
            for v, mark in zip(row, marks, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>\n" + "\n".join(rows) + "</table>"


def _plain(text) -> str:
    """Text from data as a plot label: matplotlib reads `$...$` as math and raises on what it cannot parse (a
    run id or spec name holding `$\\frac{$` stopped the report); an escaped `$` is a dollar sign."""
    return str(text).replace("$", r"\$")


def _save(fig: Figure, png: Path) -> str:
    fig.tight_layout()
    with atomic_output(png) as fresh:  # beside it, then renamed over it: a link at its name keeps its content
        FigureCanvasAgg(fig).print_png(str(fresh))
    return f'<img src="{html.escape(png.name)}" alt="{html.escape(png.stem)}">'


def _series(df: pl.DataFrame, column: str):
    """(run_id, steps, values) per run with at least one value in `column`."""
    for (run_id,), g in df.group_by("run_id", maintain_order=True):
        g = g.filter(pl.col(column).is_not_null())
        if g.height:
            yield run_id, g["step"].to_list(), g[column].to_list()


def _lines(df: pl.DataFrame, png: Path, panels: list[tuple[str, list[str]]]) -> str | None:
    """One panel per (title, columns), one line per run and column; None when no panel has a value."""
    if not any(df[c].is_not_null().any() for _, cols in panels for c in cols):
        return None
    fig = Figure(figsize=(4.2 * len(panels), 3.4))
    for i, (title, cols) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for col in cols:
            for run_id, x, y in _series(df, col):
                style = {"marker": "o", "linestyle": "--"} if col.startswith("eval") else {"marker": "."}
                ax.plot(x, y, label=_plain(run_id if len(cols) == 1 else f"{run_id} {col}"), **style)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    return _save(fig, png)


def _learning(df: pl.DataFrame, png: Path) -> str | None:
    return _lines(df, png, [("success rate", ["success", "eval_success"]), ("mean reward", ["reward"])])


def _kl(df: pl.DataFrame, png: Path) -> str | None:
    return _lines(df, png, [("KL", ["kl"]), ("entropy", ["entropy"]), ("clip fraction", ["clip_fraction"])])


def _grid(n: int, row_height: float = 3.0) -> tuple[Figure, int]:
    cols = min(n, 3)
    return Figure(figsize=(4.2 * cols, row_height * math.ceil(n / cols))), cols


def _rewards(df: pl.DataFrame, png: Path) -> str:
    specs = df["spec"].unique(maintain_order=True).to_list()
    fig, cols = _grid(len(specs))
    for i, spec in enumerate(specs):
        ax = fig.add_subplot(math.ceil(len(specs) / cols), cols, i + 1)
        ax.hist(df.filter(pl.col("spec") == spec)["total"].to_list(), bins=20)
        ax.set_title(_plain(spec), fontsize=9)
        ax.set_xlabel("episode total")
        ax.set_ylabel("episodes")
    return _save(fig, png)


def _turns(df: pl.DataFrame, png: Path) -> str:
    envs = df["env"].unique(maintain_order=True).to_list()
    fig, cols = _grid(len(envs))
    for i, env in enumerate(envs):
        g = df.filter(pl.col("env") == env)
        ax = fig.add_subplot(math.ceil(len(envs) / cols), cols, i + 1)
        ax.bar(g["num_turns"].to_list(), g["episodes"].to_list())
        ax.set_title(_plain(env), fontsize=9)
        ax.set_xlabel("turns")
        ax.set_ylabel("episodes")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(fig, png)


def _contamination(df: pl.DataFrame, _png: Path | None = None) -> str:
    """The eval runs' table with `held_out` after contaminated_tasks: `clean`, or `NOT CLEAN: K of N tasks trained
    on` in a cell that stands out, so a number that is not held out cannot be read as one."""
    labels = [held_out_label(k, n) for k, n in zip(df["contaminated_tasks"], df["tasks"], strict=True)]
    at = df.columns.index("contaminated_tasks") + 1
    table = df.insert_column(at, pl.Series("held_out", labels, dtype=pl.String))
    return _table(table, classes={"held_out": lambda v: "clean" if v == "clean" else "notclean"})


RENDER = {"runs": _table, "learning": _learning, "kl": _kl, "rewards": _rewards, "turns": _turns,
          "policies": _table, "contamination": _contamination}
