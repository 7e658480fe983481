"""The viewer's train run and trained-on pages: pure functions from what train_data read to HTML, no lake
access (served and exported pages call the same ones, as render's are called).

A train run's page: its learning curves (one chart per metric its steps hold, x = step; eval success with its
Wilson interval from the eval runs of its policies), its evals beside them (evals draws them), its config
(the fields that differ from the defaults stored with it first), its policies with their parents and evals, and its
steps with what each trained on (`train_steps.episode_ids`: the runs they came from, and a page listing them).
Every value goes through `esc`, every link through `links`.
"""

from __future__ import annotations

import json
from typing import Any

from trajlake.core.config_types import DEFAULTS_KEY, REQUIRED
from trajlake.view.charts import Point, Series, line_chart
from trajlake.view.evals import (
    evals_page,
    evals_table,
    group_name,
    headline,
    success,
    success_chart,
    versus_line,
)
from trajlake.view.markup import attrs, esc, link, page
from trajlake.view.render import episode_table
from trajlake.view.train_data import TrainView, metric, number

#: the curves a train page draws first, each where its steps hold the metric: (key, title, y range to include)
CURVES: list[tuple[str, str, tuple[float | None, float | None]]] = [
    ("reward_mean", "reward (batch mean)", (None, None)),
    ("success_mean", "success (sampled rollouts on train tasks)", (0.0, 1.0)),
    ("eval", "eval success, greedy (Wilson 95%)", (0.0, 1.0)),
    ("outcome_groups", "groups whose samples differ in success (share)", (0.0, 1.0)),
    ("loss", "loss", (None, None)),
    ("kl", "KL to the reference (the starting policy)", (None, None)),
    ("entropy", "entropy", (None, None)),
    ("response_length", "response length (agent tokens per episode)", (None, None)),
]
#: step keys that are not curves (the x itself; the eval success drawn from the eval runs)
NOT_CURVES = {"iteration", "step", "eval_success"}


# ---- the config ------------------------------------------------------------------------------------------
#: the default column of a recorded key that is no TrainConfig field
NO_FIELD = object()


def config_rows(config: dict) -> tuple[list[tuple], list[tuple], list[tuple]] | None:
    """A stored train config's (field, value, default) rows in three lists: the fields whose value differs from
    the default of the code that wrote it (stored under DEFAULTS_KEY: name -> default, REQUIRED for none), the keys
    the run recorded that are no field (its start policy, spec id...), and the fields at their default; each in
    name order. None for a run stored before its defaults were (its config then reads as recorded)."""
    defaults = config.get(DEFAULTS_KEY)
    if not isinstance(defaults, dict):
        return None
    differs, recorded, same = [], [], []
    for k in sorted(config, key=str):
        v = config[k]
        if k == DEFAULTS_KEY:
            continue
        if k not in defaults:
            recorded.append((k, v, NO_FIELD))
        elif defaults[k] == REQUIRED or v != defaults[k]:
            differs.append((k, v, defaults[k]))
        else:
            same.append((k, v, defaults[k]))
    return differs, recorded, same


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def config_block(config: dict) -> str:
    """The config table (config_rows' first two lists) and the fields at their default, folded; a config stored
    without its defaults, every key as recorded."""
    if not config:
        return "<p class=\"muted\" id=\"config\">no config recorded</p>"

    def row(k: str, v: Any, d: Any, cls: str) -> str:
        default = "" if d is NO_FIELD else f"<code>{esc(_value(d))}</code>"
        return f"<tr{attrs(class_=cls)}><td>{esc(k)}</td><td><code>{esc(_value(v))}</code></td><td>{default}</td></tr>"

    head = "<tr><th>field</th><th>value</th><th>default</th></tr>"
    rows = config_rows(config)
    if rows is None:
        body = "".join(row(k, config[k], NO_FIELD, "recorded") for k in sorted(config, key=str))
        return (f"<p>{len(config)} settings recorded (a run stored before trajlake recorded its defaults beside "
                f"them):</p><table id=\"config\">{head}{body}</table>")
    differs, recorded, same = rows
    body = "".join([row(k, v, d, "differs") for k, v, d in differs]
                   + [row(k, v, d, "recorded") for k, v, d in recorded])
    out = (f"<p>{len(differs)} fields differ from the defaults of the trajlake that ran it"
           + (f"; {len(recorded)} more recorded by the run" if recorded else "") + ":</p>"
           f"<table id=\"config\">{head}{body}</table>")
    if same:
        out += (f"<details><summary>the {len(same)} fields at their default</summary><table id=\"config-defaults\">"
                f"{head}{''.join(row(k, v, d, 'default') for k, v, d in same)}</table></details>")
    return out


# ---- the curves --------------------------------------------------------------------------------------------
def eval_series(view: TrainView) -> list[Series]:
    """The eval success of the run's policies against the step, one series per env and split, each point with
    its Wilson interval; none drawn from eval runs: the steps' own `eval_success` (no interval)."""
    out = []
    for g in view.groups:
        pts = sorted((e for e in g.evals if e.x is not None and e.episodes), key=lambda e: e.x)
        if pts:
            out.append(Series(group_name(g), [Point(e.x, *success(e), note=f"{e.eval_run}, {e.policy_id}")
                                               for e in pts]))
    if not out:
        steps = [(float(s["step"]), number(s["metrics"].get("eval_success"))) for s in view.steps]
        if any(v is not None for _, v in steps):
            out.append(Series("eval_success", steps))
    return out


def curves(view: TrainView) -> tuple[list[str], list[str]]:
    """The run's charts: (the main ones in CURVES' order, every other numeric metric its steps hold), each
    an <svg>; a metric no step holds has none."""
    main = []
    for key, title, (lo, hi) in CURVES:
        if key == "eval":
            series = eval_series(view)
            if series:
                main.append(line_chart(series, title=title, y_min=lo, y_max=hi))
            continue
        pts = [(float(s["step"]), metric(s, key)) for s in view.steps]
        if any(v is not None for _, v in pts):
            main.append(line_chart([Series(key, pts)], title=title, y_min=lo, y_max=hi))
    shown = {k for k, _, _ in CURVES} | NOT_CURVES
    others = sorted({k for s in view.steps for k, v in s["metrics"].items()
                     if k not in shown and number(v) is not None}, key=str)
    rest = [line_chart([Series(k, [(float(s["step"]), number(s["metrics"].get(k))) for s in view.steps])], title=k)
            for k in others]
    return main, rest


# ---- the train page ------------------------------------------------------------------------------------
def _policies_table(view: TrainView, links, spec: str | None, depth: int) -> str:
    rows = []
    for p in view.policies:
        ev = " ".join(link(links.run(e.eval_run, spec, depth), f"{group_name(g)} {success(e)[0]:.2f}",
                           title=e.eval_run)
                      for g in view.groups for e in g.evals if e.policy_id == p["policy_id"] and e.episodes)
        role = {"own": "checkpoint", "start": "start", "ancestor": "ancestor"}.get(p["role"], p["role"])
        rows.append(f"<tr{attrs(data_policy=p['policy_id'], data_role=p['role'])}><td>{esc(p['policy_id'])}</td>"
                    f"<td>{esc(role)}</td><td>{esc(p['step'])}</td><td>{esc(p['parent_policy_id'])}</td>"
                    f"<td>{esc(p['run_id'])}</td><td><code>{esc(p['checkpoint_uri'])}</code></td><td>{ev}</td></tr>")
    head = "".join(f"<th>{t}</th>" for t in ("policy", "role", "step", "parent", "run", "checkpoint", "evals"))
    return f"<table id=\"policies\"><tr>{head}</tr>{''.join(rows)}</table>"


def _steps_table(view: TrainView, links, spec: str | None, depth: int) -> str:
    rows = []
    for s in view.steps:
        step, listed = s["step"], s["listed"]
        srcs = view.sources.get(step, [])
        found = sum(n for _, n in srcs)
        trained = (link(links.trained(view.run_id, step, spec, depth), f"{listed:,} episodes") if listed else "")
        if found < listed:
            trained += f" <span class=\"muted\">({listed - found:,} not in the lake at this snapshot)</span>"
        where = ", ".join((link(links.run(r, spec, depth), r) if r is not None else "no run") + f" ({n:,})"
                          for r, n in srcs)
        rows.append(f"<tr{attrs(data_step=step)}><td>{esc(step)}</td><td>{esc(s['policy_id'])}</td>"
                    f"<td>{esc(s['snapshot_read'])}</td><td>{esc(s['spec_id'])}</td><td>{trained}</td>"
                    f"<td>{where}</td></tr>")
    head = "".join(f"<th>{t}</th>" for t in ("step", "policy", "snapshot read", "spec", "trained on", "from runs"))
    return f"<table id=\"steps\"><tr>{head}</tr>{''.join(rows)}</table>"


def train_page(view: TrainView, links, spec: str | None) -> str:
    """Train run `view.run_id`'s page (the module docstring)."""
    depth = 1 if links.static else 0
    run = view.run or {}
    config = run.get("config") or {}
    facts = [("algo", config.get("algo")), ("status", run.get("status")), ("steps", len(view.steps)),
             ("started", run.get("started_at")), ("finished", run.get("finished_at")),
             ("parent run", run.get("parent_run_id")), ("code", run.get("code_version"))]
    evals_link = link(links.evals(view.run_id, spec, depth), "its evals compared")
    body = [f"<p>{link(links.index(depth), 'runs')} | {evals_link}</p><h1>Train run {esc(view.run_id)}</h1>"
            "<p class=\"muted\" id=\"facts\">" + ", ".join(f"{k} {esc(v)}" for k, v in facts if v is not None) + "</p>"]
    if not view.run:
        body.append("<p class=\"notclean\">no runs row for this run id: only its steps are stored</p>")
    main, rest = curves(view)
    charts = ("<p class=\"muted\" id=\"no-steps\">no steps recorded</p>" if not view.steps and not main
              else f"<div class=\"charts\">{''.join(main)}</div>")
    if rest:
        charts += (f"<details id=\"other-metrics\"><summary>{len(rest)} more metrics</summary>"
                   f"<div class=\"charts\">{''.join(rest)}</div></details>")
    evals = "".join(f"<h3>{esc(group_name(g))}</h3>" + success_chart(g)
                    + evals_table(g, links, spec, depth, f"train-evals-{k}", compact=True) + (
                        versus_line(*headline(g)) if headline(g) else "") for k, g in enumerate(view.groups))
    evals = evals or "<p class=\"muted\" id=\"no-evals\">no evals of this run's policies</p>"
    body.append(f"<div class=\"panes\"><div id=\"curves\"><h2>Learning curves</h2>{charts}</div>"
                f"<div id=\"evals\"><h2>Evals</h2>{evals}<p>"
                f"{link(links.evals(view.run_id, spec, depth), 'compare them task by task')}</p></div></div>")
    body.append("<h2>Config</h2>" + config_block(config))
    body.append("<h2>Policies</h2>" + _policies_table(view, links, spec, depth))
    body.append("<h2>Steps</h2>" + _steps_table(view, links, spec, depth))
    if view.children:
        kids = " ".join(link(links.run(c["run_id"], spec, depth), c["run_id"]) for c in view.children)
        body.append(f"<h2>Runs under it</h2><p id=\"children\">{kids}</p>")
    return page(f"train {view.run_id}", "".join(body))


def train_evals_page(view: TrainView, links, spec: str | None) -> str:
    """Train run `view.run_id`'s evals compared (`evals_page`)."""
    depth = 1 if links.static else 0
    intro = ("<p class=\"muted\">the evals of the run's checkpoints, with those of the policy it started from and "
             "its ancestors on the same tasks; success over the played episodes (env errors left out) with "
             "Wilson's 95% interval</p>")
    return evals_page(f"evals of {view.run_id}", intro, view.groups, links, spec,
                      " | " + link(links.train(view.run_id, spec, depth), f"train run {view.run_id}"))


def trained_page(run_id: str, step: int, rows: list[dict], *, total: int, listed: int,
                 sources: list[tuple[str | None, int]], links, spec: str | None, spec_line: str) -> str:
    """The episodes step `step` of train run `run_id` trained on (the first RUN_PAGE_ROWS by id of `total`
    found; `listed` in its row), with the runs they came from."""
    depth = 1 if links.static else 0
    where = ", ".join((link(links.run(r, spec, depth), r) if r is not None else "no run") + f" ({n:,})"
                      for r, n in sources)
    note = (f"<p class=\"muted\" id=\"parts\">showing the first {len(rows):,} of {total:,} by id</p>"
            if total > len(rows) else "")
    missing = f"; {listed - total:,} no longer in the lake at this snapshot" if listed > total else ""
    body = (f"<p>{link(links.index(depth), 'runs')} | {link(links.train(run_id, spec, depth), f'train run {run_id}')}"
            f"</p><h1>Step {esc(step)} of {esc(run_id)}: what it trained on</h1>"
            f"<p id=\"sources\">{listed:,} episodes{esc(missing)}, from {where or 'no run'}</p>" + spec_line + note
            + episode_table(rows, links, spec, depth))
    return page(f"train {run_id} step {step}", body)


__all__ = ["CURVES", "config_rows", "curves", "eval_series", "train_evals_page", "train_page", "trained_page"]
