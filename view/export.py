"""`trajlake view --out DIR`: the viewer's pages as static files, read from the lake in a few bulk queries.

Every page is rendered by render's functions, as a served page is; only the reading differs. A served
page reads its own rows (3-4 queries of ~0.1 s each, most of it pinning the snapshot: 3-4 pages/s), so the
export reads every page's rows at once, at the one pinned snapshot:

* the runs (the index) and every episode with its reward, group advantage and task instruction (one query,
  one row per episode: the run pages and the episode pages' headers);
* the turns and the token rewards (`reward_spans`) of the exported episodes in chunks of CHUNK episodes
  (contiguous in id order, so each chunk is one `episode_id BETWEEN` filter DuckLake prunes files by), one
  chunk in memory at a time, so a big lake's export stays within a bounded amount of memory.

Page names come from `Links.page_file` (ids encoded by `path_component`) and every file is written by
`_write`, checked to lie inside the output folder, so no id, whatever it holds, names a file outside it,
and renamed over its name, so no link planted there carries the page into another file.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from trajlake.core.atomic import write_text_atomically
from trajlake.core.errors import TrajlakeError
from trajlake.core.progress import StepProgress
from trajlake.store.reads import latest_spec
from trajlake.view.pages import RUN_PAGE_ROWS, RUNS_SQL, TURN_COLUMNS, Links, Pages, _tokenizer_for
from trajlake.view.render import TokenText, episode_block, rewards_from_spans
from trajlake.view.train_data import read_train, sparks, train_ids

#: episodes whose turns and token rewards are read (and held) at once
CHUNK = 2000

#: every episode with what its run page row and its page header show; the advantage is EPISODE_SQL's, each
#: episode without a group its own partition (as a served page reads it: a group of one)
ALL_EPISODES_SQL = """
SELECT e.episode_id, e.run_id, e.env, e.policy_id, e.task_id, e.sample_index, e.status, e.success, e.env_reward,
       e.num_turns, e.num_agent_tokens, e.error, t.instruction, r.total AS reward,
       (r.total - avg(r.total) OVER g) / nullif(stddev_samp(r.total) OVER g, 0) AS advantage,
       count(*) OVER g AS group_size
FROM episodes e LEFT JOIN episode_rewards r ON r.episode_id = e.episode_id AND r.spec_id = ?
     LEFT JOIN tasks t ON t.task_id = e.task_id
WINDOW g AS (PARTITION BY e.group_id, CASE WHEN e.group_id IS NULL THEN e.episode_id END)
ORDER BY e.episode_id
"""
CHUNK_TURNS_SQL = (f"SELECT episode_id, {TURN_COLUMNS} FROM turns WHERE episode_id BETWEEN ? AND ? "
                   "ORDER BY episode_id, turn")
CHUNK_SPANS_SQL = ("SELECT episode_id, position, length, reward FROM reward_spans "
                   "WHERE spec_id = ? AND episode_id BETWEEN ? AND ?")


def _pin(lake, snapshot: int | None) -> int:
    if snapshot is None:
        return lake.current_snapshot()
    if snapshot not in lake.snapshots()["snapshot_id"].to_list():
        raise TrajlakeError(f"snapshot {snapshot} is not a snapshot of the lake (trajlake snapshots lists them)")
    return snapshot


def _inside(root: Path, path: Path) -> Path:
    """`path` if it resolves inside `root` (itself resolved); else a TrajlakeError: a link planted in the
    output folder must not carry a page elsewhere."""
    real = path.resolve()
    if real != root and not real.is_relative_to(root):
        raise TrajlakeError(f"{path} leads outside the output folder {root} (a link?); remove it or pick another "
                            "folder")
    return real


def _write(root: Path, folder: str, name: str, text: str) -> None:
    """Write `root/folder/name`, checked to lie inside `root`. A link planted at the file's own name is refused,
    not followed; the page is written beside its name and renamed over it (core/atomic.py), so a hard link
    planted there (to a lake file, say) keeps its content."""
    parent = _inside(root, root / folder) if folder else root
    target = parent / name
    if target.parent != parent or name in ("", ".", ".."):  # a name from path_component never does this
        raise TrajlakeError(f"page name {name!r} is not one file name")
    if target.is_symlink():
        raise TrajlakeError(f"cannot write viewer page {target}: it is a link")
    try:
        write_text_atomically(target, text)
    except OSError as e:
        raise TrajlakeError(f"cannot write viewer page {target}: {e.strerror or e}") from None


def _out_folder(out: str | Path) -> Path:
    """The export folder, created and resolved (symlinks followed once, here, so every check below compares
    real paths), with its page folders inside it (runs/, episodes/, and train/, evals/, trained/ for train runs)."""
    root = Path(out).expanduser()
    if root.exists() and not root.is_dir():
        raise TrajlakeError(f"viewer output {root} is a file; pass a folder (it is created if missing)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        root = root.resolve(strict=True)
        for sub in ("runs", "episodes", "train", "evals", "trained"):
            (root / sub).mkdir(exist_ok=True)
            _inside(root, root / sub)
    except OSError as e:
        raise TrajlakeError(f"cannot create viewer folder {root}: {e.strerror or e}") from None
    return root


def _run_pages(root: Path, pages: Pages, episodes: pl.DataFrame, kinds: dict) -> int:
    """Every run's page (in parts of RUN_PAGE_ROWS episodes) from `episodes`, in id order; how many files."""
    written = 0
    # an episode without a run has no run page to be listed on (the runs page lists runs)
    for (run_id,), rows in episodes.filter(pl.col("run_id").is_not_null()).partition_by(
            "run_id", as_dict=True, maintain_order=True).items():
        held_out = pages._held_out(run_id) if kinds.get(run_id) == "eval" else ""
        for part, first in enumerate(range(0, rows.height, RUN_PAGE_ROWS), start=1):
            text = pages.run_from(run_id, rows.slice(first, RUN_PAGE_ROWS).to_dicts(), total=rows.height,
                                  part=part, held_out=held_out)
            _write(root, "runs", Links.page_file(run_id, part), text)
            written += 1
    return written


#: the distinct episodes each step of train runs $1 trained on
STEP_EPISODES_SQL = ("SELECT run_id, step, list_distinct(episode_ids) AS ids FROM train_steps "
                     "WHERE run_id IN (SELECT unnest($1::VARCHAR[])) AND episode_ids IS NOT NULL ORDER BY run_id, step")


def _train_pages(root: Path, pages: Pages, episodes: pl.DataFrame) -> int:
    """Every train run's page and its evals' page (read for all of them at once, rendered one by one), and the
    page of what each of its steps trained on (from `episodes`, every episode's row); how many files."""
    lake, snap = pages.lake, pages.snapshot
    views = read_train(lake, snap, train_ids(lake, snap))
    written = 0
    for run_id, view in views.items():
        _write(root, "train", Links.page_file(run_id), pages.train_from(view))
        _write(root, "evals", Links.page_file(run_id), pages.evals_from(view))
        written += 2
    if not views:
        return written
    steps = lake.query(STEP_EPISODES_SQL, [list(views)], snapshot=snap, output="arrow").to_pylist()
    for s in steps:
        if not s["ids"]:
            continue
        found = episodes.filter(pl.col("episode_id").is_in(s["ids"]))
        text = pages.trained_from(s["run_id"], s["step"], found.head(RUN_PAGE_ROWS).to_dicts(), total=found.height,
                                  listed=len(s["ids"]), sources=views[s["run_id"]].sources.get(s["step"], []))
        _write(root, "trained", Links.trained_file(s["run_id"], s["step"]), text)
        written += 1
    return written


def _by_episode(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["episode_id"], []).append(r)
    return out


def _episode_pages(root: Path, pages: Pages, episodes: pl.DataFrame, bar: StepProgress) -> None:
    """Every episode page of `episodes` (in id order), CHUNK episodes at a time."""
    lake, snap, spec = pages.lake, pages.snapshot, pages.spec
    tokens: dict[tuple, TokenText | None] = {}  # (run, policy) -> its tokenizer's token texts
    for first in range(0, episodes.height, CHUNK):
        eps = episodes.slice(first, CHUNK).to_dicts()
        lo, hi = eps[0]["episode_id"], eps[-1]["episode_id"]
        turns = _by_episode(lake.query(CHUNK_TURNS_SQL, [lo, hi], snapshot=snap, output="arrow").to_pylist())
        spans: dict[str, list[tuple]] = {}
        if spec:
            got = lake.query(CHUNK_SPANS_SQL, [spec, lo, hi], snapshot=snap, output="arrow").to_pydict()
            for eid, *span in zip(got["episode_id"], got["position"], got["length"], got["reward"], strict=True):
                spans.setdefault(eid, []).append(span)
        for ep in eps:
            eid, key = ep["episode_id"], (ep["run_id"], ep["policy_id"])
            if key not in tokens:
                tok = _tokenizer_for(lake, snap, *key)
                tokens[key] = None if tok is None else TokenText(tok)
            block = episode_block(eid, ep, turns.get(eid, []), rewards_from_spans(spans.get(eid, ())), tokens[key],
                                  spec)
            _write(root, "episodes", Links.page_file(eid), pages.episode_from(eid, block))
        bar.update(advance=len(eps), stats=f"{len(eps)} more episodes")


def export_site(lake, out: str | Path, *, snapshot: int | None = None, spec: str | None = None,
                max_episodes: int | None = None, progress: bool = True) -> int:
    """Write the viewer's pages to folder `out` (runs, every run's episodes, every train run's page, evals and
    trained-on episodes, and every episode's page, or the first `max_episodes` by id); returns how many episode
    pages. `progress`: say how far it is on stderr."""
    snap = _pin(lake, snapshot)
    pages = Pages(lake, snap, spec or latest_spec(lake, snapshot=snap), Links(static=True))
    pages.check_spec(spec)
    root = _out_folder(out)
    runs = lake.query(RUNS_SQL, snapshot=snap)
    episodes = lake.query(ALL_EPISODES_SQL, [pages.spec], snapshot=snap)
    exported = episodes if max_episodes is None else episodes.head(max(0, int(max_episodes)))
    with StepProgress("view --out", "episode pages", exported.height, enabled=progress) as bar:
        _write(root, "", "index.html", pages.runs_from(runs.to_dicts(), sparks(lake, snap)))
        kinds = dict(zip(runs["run_id"].to_list(), runs["kind"].to_list(), strict=True))
        n = _run_pages(root, pages, episodes, kinds)
        t = _train_pages(root, pages, episodes)
        bar.update(stats=f"the index and {n} run pages" + (f", {t} train run pages" if t else ""))
        _episode_pages(root, pages, exported, bar)
    return exported.height


__all__ = ["CHUNK", "export_site"]
