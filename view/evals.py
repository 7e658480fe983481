"""The viewer's eval comparison: pure functions from the evals train_data read to HTML, no lake access
(a train run's page shows a group's chart and table beside its curves; the comparison page shows them all).

Per env and split: each eval's success with its Wilson interval and held-out label, and per task which policy
solved it, with the wins and losses between them. Every value goes through `esc`, every link through `links`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trajlake.evaluate.metrics import held_out_label, wilson_interval
from trajlake.view.charts import fmt, interval_chart
from trajlake.view.markup import attrs, esc, link, page
from trajlake.view.train_data import EvalGroup, PolicyEval

#: the most evals a group compares task by task (more: the baselines, the last, and evenly between)
MAX_COMPARED = 8


# ---- numbers ----------------------------------------------------------------------------------------------
def success(e: PolicyEval) -> tuple[float | None, float | None, float | None]:
    """(rate, low, high) of an eval's played episodes, Wilson's 95% interval; Nones over none."""
    n, s = e.episodes, e.successes
    if not n:
        return None, None, None
    lo, hi = wilson_interval(s, n)
    return s / n, lo, hi


def _rate_text(e: PolicyEval) -> str:
    rate, lo, hi = success(e)
    if rate is None:
        return "none"
    return f"{rate:.2f} [{lo:.2f}, {hi:.2f}] ({e.successes} of {e.episodes})"


def _task_rate(t: tuple[int, int, str] | None) -> float | None:
    return None if t is None or not t[0] else t[1] / t[0]


def versus(a: PolicyEval, b: PolicyEval) -> tuple[int, int, int, int]:
    """(shared tasks, a better, b better, the same) over the tasks both evals played (per task: its success
    rate over its samples)."""
    shared = [t for t in a.tasks if t in b.tasks]
    better = sum(_task_rate(a.tasks[t]) > _task_rate(b.tasks[t]) for t in shared)
    worse = sum(_task_rate(a.tasks[t]) < _task_rate(b.tasks[t]) for t in shared)
    return len(shared), better, worse, len(shared) - better - worse


# ---- evals -------------------------------------------------------------------------------------------------
def group_name(g: EvalGroup) -> str:
    return f"{g.env or '?'} {g.split or '?'}"


def role_text(e: PolicyEval) -> str:
    return {"own": f"step {fmt(e.x)}" if e.x is not None else "own", "start": "start",
            "ancestor": "ancestor", "a": "a", "b": "b"}.get(
        e.role, f"in-training eval at step {fmt(e.x)}" if e.x is not None else "in-training eval")


def _label(e: PolicyEval) -> str:
    return f"{e.policy_id or '?'} ({role_text(e)})"


def _held(e: PolicyEval) -> str:
    h = e.held_out
    if not h:
        return "<td class=\"muted\">?</td>"
    label = held_out_label(h["contaminated_tasks"], h["tasks"])
    return f"<td{attrs(class_='clean' if not h['contaminated_tasks'] else 'notclean')}>{esc(label)}</td>"


def evals_table(g: EvalGroup, links, spec: str | None, depth: int, table_id: str, *, compact: bool = False) -> str:
    """A group's evals, one row each: the eval run (its page), policy, role, tasks, success with its Wilson
    interval, and whether it is held out (`held_out_label`, with the clean success when it is not). `compact`
    (beside the curves): the policy links to its eval run, and the tasks are left out."""
    cols = ("policy", "role", "success [95%]", "held out") if compact else (
        "eval run", "policy", "role", "tasks", "success [95%]", "held out")
    rows = []
    for e in g.evals:
        clean = ""
        if e.held_out and e.held_out["contaminated_tasks"] and e.held_out["clean_success_rate"] is not None:
            clean = f"; on its clean tasks {e.held_out['clean_success_rate']:.2f}"
        to_run = links.run(e.eval_run, spec, depth)
        first = (f"<td>{link(to_run, e.policy_id or '?', title=e.eval_run)}</td>" if compact else
                 f"<td>{link(to_run, e.eval_run)}</td><td>{esc(e.policy_id)}</td>")
        rows.append(f"<tr{attrs(data_run=e.eval_run, data_role=e.role)}>{first}<td>{esc(role_text(e))}</td>"
                    + ("" if compact else f"<td>{len(e.tasks)}</td>")
                    + f"<td class=\"num\">{esc(_rate_text(e) + clean)}</td>{_held(e)}</tr>")
    head = "".join(f"<th>{t}</th>" for t in cols)
    return f"<table{attrs(id=table_id, class_='evals')}><tr>{head}</tr>{''.join(rows)}</table>"


def success_chart(g: EvalGroup) -> str:
    return interval_chart([(_label(e), *success(e)) for e in g.evals],
                          title=f"success on {group_name(g)} (Wilson 95%)")


def compared(evals: Sequence[PolicyEval]) -> list[PolicyEval]:
    """The evals a group compares task by task: all of up to MAX_COMPARED; of more, the last two baselines
    (ancestors, the start) and the rest evenly spaced, the first and the last of them included."""
    evals = list(evals)
    if len(evals) <= MAX_COMPARED:
        return evals
    base = [e for e in evals if e.role in ("ancestor", "start")][-2:]
    rest = [e for e in evals if e not in base]
    k = MAX_COMPARED - len(base)
    idx = sorted({round(i * (len(rest) - 1) / (k - 1)) for i in range(k)})
    return base + [rest[i] for i in idx]


def headline(g: EvalGroup) -> tuple[PolicyEval, PolicyEval] | None:
    """The pair a group's comparison leads with: its last eval against the start's (else its first)."""
    if len(g.evals) < 2:
        return None
    last = g.evals[-1]
    starts = [e for e in g.evals[:-1] if e.role in ("start", "a")]
    return (starts[-1] if starts else g.evals[0]), last


def versus_line(a: PolicyEval, b: PolicyEval) -> str:
    n, better, worse, same = versus(b, a)
    return (f"<p class=\"versus\">{esc(_label(b))} against {esc(_label(a))}, on the {n} tasks both played: "
            f"<b class=\"win\">better on {better}</b>, <b class=\"loss\">worse on {worse}</b>, the same on {same}</p>")


def wins_table(evals: Sequence[PolicyEval], table_id: str) -> str:
    """Row against column: on how many of the tasks both played the row's policy did better (success rate
    per task)."""
    head = "".join(f"<th{attrs(title=_label(e))}>#{i + 1}</th>" for i, e in enumerate(evals))
    rows = []
    for i, a in enumerate(evals):
        cells = []
        for j, b in enumerate(evals):
            if i == j:
                cells.append("<td class=\"muted\">-</td>")
                continue
            n, better, worse, _ = versus(a, b)
            cells.append(f"<td{attrs(title=f'#{i + 1} better on {better}, worse on {worse}, of {n} shared tasks')}>"
                         f"{better} / {worse}</td>")
        rows.append(f"<tr><th>#{i + 1} {esc(_label(a))}</th>{''.join(cells)}</tr>")
    return (f"<table{attrs(id=table_id, class_='wins')}><tr><th>better / worse than</th>{head}</tr>"
            f"{''.join(rows)}</table>")


def _natural(task: str | None) -> tuple:
    """A task id's sort key, its numbers as numbers (doors/test/3/2 before doors/test/3/10); none last."""
    return (task is None, [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(task))])


def tasks_table(evals: Sequence[PolicyEval], links, spec: str | None, depth: int, table_id: str) -> str:
    """One row per task any of `evals` played, those where they differ first: each eval's result on it
    (✓, ✗, or successes/samples), linked to its first episode."""
    tasks = sorted({t for e in evals for t in e.tasks}, key=_natural)
    lines = []
    for t in tasks:
        rates = {_task_rate(e.tasks.get(t)) for e in evals} - {None}
        differs = len(rates) > 1
        cells = []
        for e in evals:
            got = e.tasks.get(t)
            if got is None:
                cells.append("<td></td>")
                continue
            n, s, eid = got
            text = ("✓" if s else "✗") if n == 1 else f"{s}/{n}"
            cls = "ok" if s == n else "bad" if s == 0 else "part"
            cells.append(f"<td{attrs(class_=cls)}>{link(links.episode(eid, spec, depth), text, title=eid)}</td>")
        lines.append((not differs, _natural(t), f"<tr{attrs(data_task=t, data_differs=str(differs).lower())}>"
                      f"<td>{esc(t)}</td>{''.join(cells)}</tr>"))
    head = "".join(f"<th{attrs(title=e.eval_run)}>#{i + 1} {esc(_label(e))}</th>" for i, e in enumerate(evals))
    n_diff = sum(1 for d, _, _ in lines if not d)
    return (f"<p>{n_diff} of {len(lines)} tasks with different results (listed first):</p>"
            f"<table{attrs(id=table_id, class_='tasks')}><tr><th>task</th>{head}</tr>"
            + "".join(html for _, _, html in sorted(lines, key=lambda x: x[:2])) + "</table>")


def group_section(g: EvalGroup, k: int, links, spec: str | None, depth: int) -> str:
    """One env and split of a comparison: the success chart and table, the lead pair, the wins matrix and
    the per-task results (at most MAX_COMPARED evals side by side)."""
    cmp = compared(g.evals)
    out = [f"<section{attrs(class_='evalgroup', id=f'group-{k}', data_env=g.env, data_split=g.split)}>"
           f"<h2>{esc(g.env or '?')}, split {esc(g.split or '?')}</h2>", success_chart(g),
           evals_table(g, links, spec, depth, f"evals-{k}")]
    pair = headline(g)
    if pair:
        out.append(versus_line(*pair))
    if len(cmp) < len(g.evals):
        out.append(f"<p class=\"muted\">task by task: {len(cmp)} of the {len(g.evals)} evals (the baselines, the "
                   "first and the last of the run's, evenly spaced between)</p>")
    if len(cmp) > 2:
        out.append("<h3>Better / worse, row against column, on the tasks both played</h3>"
                   + wins_table(cmp, f"wins-{k}"))
    out.append("<h3>Per task</h3>" + tasks_table(cmp, links, spec, depth, f"tasks-{k}") + "</section>")
    return "".join(out)


def evals_page(title: str, intro: str, groups: list[EvalGroup], links, spec: str | None, nav: str) -> str:
    """A comparison page (`nav`, HTML: the way back): `intro` (HTML) then one section per group."""
    depth = 1 if links.static else 0
    body = [f"<p>{link(links.index(depth), 'runs')}{nav}</p><h1>{esc(title)}</h1>{intro}"]
    body += [group_section(g, k, links, spec, depth) for k, g in enumerate(groups)]
    if not groups:
        body.append("<p class=\"muted\" id=\"no-evals\">no evals of this run's policies</p>")
    return page(title, "".join(body))


def pair_page(a: str, b: str, groups: list[EvalGroup], links, spec: str | None) -> str:
    """Eval runs `a` and `b` compared (served: `/evals?a=A&b=B`)."""
    return evals_page(f"evals {a} and {b}", "", groups, links, spec, "")


__all__ = ["MAX_COMPARED", "compared", "evals_page", "evals_table", "group_name", "headline", "pair_page",
           "success", "success_chart", "tasks_table", "versus", "versus_line", "wins_table"]
