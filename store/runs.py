"""The run ledger: the one place that writes the `runs` table, for every kind of run (collect, eval, import,
train and sft, and the train runs a rescore makes).

A run's life is one context, the same for every stage:

    with runs.open(lake, "collect", config, run_id=run_id) as run:   # refuses, takes the lease
        run.begin(Run(...), rows=...)     # the first write (or run.restart() for a resumed run)
        ...                               # the stage's work
    # finished; failed with the error if the body raised; the lease given back either way

`open` finds the stored run the config resumes (`find`, reads only), refusing with nothing written a run id
stored as another kind of run or with other identifying settings (`differences`, worded by
`describe_differences`); takes the run id's lease (store/lease.py: one live process per run id) and finds it
again as a previous holder left it. `begin` writes a new run's row ("running") in one snapshot with the rows
that must not be visible without it, `restart` marks a resumed run running again; on leaving the context a run
the body began or restarted is marked finished, or failed with the error that left it, unless the body ended
it itself. Which settings identify a run is declared on the config dataclass's fields
(trajlake.core.config_types: `operational`, `added_later`), the same way for every stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trajlake.core.clock import utc_now
from trajlake.core.config_types import added_fields, leaf_values, run_fields
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Run

if TYPE_CHECKING:
    from trajlake.store.lake import Lake
    from trajlake.store.lease import Lease
    from trajlake.store.write import CommitResult

#: the kinds of run the ledger holds, a closed set (sft and a rescore's runs are train runs)
KINDS = ("collect", "eval", "import", "train")

#: (field, stored value, given value): one identifying setting a resume would change
Difference = tuple[str, Any, Any]
#: what a failure's text is cut to in the commit message that records it
ERROR_CHARS = 200

STORED_SQL = """
SELECT run_id, kind, status, config, parent_run_id, started_at, finished_at FROM runs WHERE run_id = ?
"""


@dataclass(frozen=True)
class StoredRun:
    """A row of `runs`, its config read back as a dict (a JSON column may come back as text or as a value)."""

    run_id: str
    kind: str
    status: str | None
    config: dict[str, Any]
    parent_run_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


def new_run_id(kind: str) -> str:
    """A fresh id for a run nobody named: `<kind>-<UTC time>-<6 hex digits>`."""
    return f"{kind}-{utc_now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def hashed_run_id(prefix: str, content: Any, digits: int) -> str:
    """`<prefix><digits hex digits of the sha256 of content as JSON>`: the same content, the same run (so doing
    it again finds the stored run and its rows)."""
    return prefix + hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:digits]


def as_stored(config: Mapping[str, Any]) -> Any:
    """`config` as it reads back from the store (tuples as lists, every key a string)."""
    return json.loads(json.dumps(config))


def stored(lake: Lake, run_id: str, *, snapshot: int | None = None) -> StoredRun | None:
    """The run `run_id` as stored (at `snapshot`, else now), or None."""
    rows = lake.query(STORED_SQL, [run_id], snapshot=snapshot)
    if rows.height == 0:
        return None
    row = rows.row(0, named=True)
    config = row.pop("config")
    return StoredRun(**row, config=json.loads(config) if isinstance(config, str) else dict(config or {}))


def differences(stored_config: Mapping[str, Any], config: Any, *,
                adjust: Callable[[str, Any, Any], tuple[Any, Any] | None] | None = None,
                order: tuple[str, ...] = ()) -> list[Difference]:
    """(field, stored value, given value) for each run-identifying field of the dataclass `config` whose value
    differs from `stored_config` (a run's stored config). A field the stored config lacks (a run stored before
    the field existed) is not compared, unless it is declared `added_later`: then it compares as the value
    those runs were made at. `adjust(field, stored, given)` returns the pair to compare instead (e.g. an unset
    value as the default it stands for), or None when the two are the same run whatever they hold. `order`
    names fields to list first, in that order; the others follow in declaration order."""
    given = as_stored(leaf_values(config))
    before = added_fields(type(config))
    out = []
    for name in run_fields(type(config), tuple(order)):
        if name not in given or (name not in stored_config and name not in before):
            continue  # a section `config` leaves out (None), or a field the stored run predates
        old, new = stored_config.get(name, before.get(name)), given[name]
        pair = adjust(name, old, new) if adjust else (old, new)
        if pair is not None and pair[0] != pair[1]:
            out.append((name, *pair))
    return out


def describe_differences(run_id: str, diffs: list[Difference]) -> str:
    """One line refusing to resume `run_id` with other settings, naming each field's stored and given value."""
    def show(v: Any) -> str:
        text = repr(v)  # a long value keeps both ends: a path's file name is what tells two values apart
        return text if len(text) <= 80 else text[:30] + "..." + text[-47:]

    if len(diffs) == 1:
        name, old, new = diffs[0]
        stored_text, given = f"{name} {show(old)}", show(new)
    else:
        stored_text = ", ".join(f"{n} {show(o)}" for n, o, _ in diffs)
        given = ", ".join(f"{n} {show(v)}" for n, _, v in diffs)
    return f"run {run_id} already exists with {stored_text}; given {given} (use a new --run-id)"


def compare(run: StoredRun, config: Any, *, error: type[TrajlakeError] = TrajlakeError, **context: Any) -> None:
    """Raise `error`, in one line naming each field with its stored and given value, when the identifying
    settings of `config` differ from those `run` was stored with (`config.differences(run.config, **context)`,
    which a config makes with `differences`)."""
    diffs = config.differences(run.config, **context)
    if diffs:
        raise error(describe_differences(run.run_id, diffs))


def find(lake: Lake, run_id: str | None, config: Any, *, kinds: tuple[str, ...],
         error: type[TrajlakeError] = TrajlakeError, **context: Any) -> StoredRun | None:
    """The stored run that `config` (with `run_id`) resumes, or None for a new run. Reads only; raises `error`
    when that run is stored as a kind not in `kinds` (the first one names the stage) or with other identifying
    settings (`config.differences(stored config, **context)`)."""
    if not run_id:
        return None
    run = stored(lake, run_id)
    if run is None:
        return None
    if run.kind not in kinds:
        raise error(f"run {run_id} already exists as {_a(run.kind)} run, not {_a(kinds[0])} run (use a new --run-id)")
    compare(run, config, error=error, **context)
    return run


def _a(kind: str) -> str:
    """A run kind with its article: "a collect", "an import"."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def begin(lake: Lake, run: Run, *, stage: str, message: str | None = None,
          rows: Mapping[str, Any] | None = None) -> CommitResult:
    """Write `run`'s row with `rows` of other tables in one snapshot, so none of them is visible without the
    run. A run id already stored keeps its row (the store skips stored keys): a resumed run writes only what
    it adds."""
    return record(lake, [run], stage=stage, run_id=run.run_id, message=message, rows=rows)


def record(lake: Lake, run_rows: list[Run], *, stage: str, run_id: str | None = None, message: str | None = None,
           rows: Mapping[str, Any] | None = None) -> CommitResult:
    """Write `run_rows` (e.g. the runs of a dataset being imported, already ended) with `rows` of other tables
    in one snapshot; run ids already stored are skipped."""
    return lake.append({"runs": run_rows, **(rows or {})}, stage=stage, run_id=run_id, message=message)


def restart(lake: Lake, run: StoredRun, *, stage: str, config: Mapping[str, Any] | None = None,
            message: str | None = None) -> int | None:
    """Mark the stored `run` running again (unless it is), and with `config`, record it as the run's config
    when it differs from the stored one (a restart's operational settings). Returns the snapshot, or None
    when nothing changed."""
    changes: dict[str, Any] = {}
    if run.status != "running":
        changes.update(status="running", finished_at=None)
    if config is not None and as_stored(config) != run.config:
        changes["config"] = dict(config)
    if not changes:
        return None
    return lake.update("runs", {"run_id": run.run_id}, changes, stage=stage, run_id=run.run_id,
                       message=message or f"{stage}: resume run {run.run_id}")


def finish(lake: Lake, run_id: str, *, stage: str) -> int | None:
    """Mark the run finished, now."""
    return _end(lake, run_id, "finished", stage=stage, message=f"{stage}: run {run_id} finished")


def fail(lake: Lake, run_id: str, *, stage: str, error: BaseException | str | None = None) -> int | None:
    """Mark the run failed, now; `error` (an exception or its text) is recorded in the snapshot's commit
    message (one line, cut to ERROR_CHARS characters)."""
    message = f"{stage}: run {run_id} failed"
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if error:
        line = " ".join(str(error).split())
        message += ": " + (line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 3] + "...")
    return _end(lake, run_id, "failed", stage=stage, message=message)


def fail_abandoned(lake: Lake, run_ids: list[str], *, stage: str, why: str) -> list[str]:
    """Mark failed, saying `why`, each of `run_ids` still running whose process is gone without ending it (an
    async collector stopped with its learner): each run's lease is taken first, so a run whose holder is alive,
    or on another host, where its process cannot be seen, is left as it is. Returns the runs marked."""
    from trajlake.store import lease as run_lease

    marked = []
    for run_id in run_ids:
        try:
            held = run_lease.acquire(lake, run_id, stage)
        except run_lease.RunLeasedError:
            continue
        with held:
            run = stored(lake, run_id)
            if run is not None and run.status == "running":
                fail(lake, run_id, stage=stage, error=why)
                marked.append(run_id)
    return marked


def _end(lake: Lake, run_id: str, status: str, *, stage: str, message: str | None) -> int | None:
    return lake.update("runs", {"run_id": run_id}, {"status": status, "finished_at": utc_now()}, stage=stage,
                       run_id=run_id, message=message)


@dataclass
class OpenRun:
    """A run inside `open`: its id, the stored run it resumes (None: a new one), and its ledger writes. The
    context marks it finished or failed on leaving once the body began or restarted it (`written`), unless the
    body ended it itself (`ended`)."""

    lake: Lake
    run_id: str
    stage: str
    resumed: StoredRun | None
    config: Any = None
    kinds: tuple[str, ...] = ()
    error: type[TrajlakeError] = TrajlakeError
    lease: Lease | None = None
    written: bool = False
    ended: bool = False

    def take_lease(self, **context: Any) -> None:
        """Take the run id's lease now (an `open(..., lease=False)` that found work to do) and find the run
        again as a previous holder left it (`context`: as `find`'s)."""
        from trajlake.store import lease as run_lease

        if self.lease is None:
            self.lease = run_lease.acquire(self.lake, self.run_id, self.stage)
        self.find(**context)

    def find(self, **context: Any) -> StoredRun | None:
        """The stored run again (refusing other settings: `context` as `find`'s), e.g. once a setting that
        identifies the run is known (a collect run's system prompt, after its policy loaded)."""
        self.resumed = find(self.lake, self.run_id, self.config, kinds=self.kinds, error=self.error, **context)
        return self.resumed

    def begin(self, run: Run, *, message: str | None = None, rows: Mapping[str, Any] | None = None) -> CommitResult:
        """The run's row with `rows` of other tables in one snapshot (`begin`); a stored run keeps its row."""
        out = begin(self.lake, run, stage=self.stage, message=message, rows=rows)
        self.written = True
        return out

    def restart(self, *, config: Mapping[str, Any] | None = None, message: str | None = None) -> int | None:
        """The resumed run marked running again (`restart`); the run is then this context's to end."""
        if self.resumed is None:
            raise TrajlakeError(f"run {self.run_id}: there is no stored run to restart")
        out = restart(self.lake, self.resumed, stage=self.stage, config=config, message=message)
        self.written = True
        return out

    def keep_status(self) -> None:
        """Leave the run's row as stored on leaving the context (a resume that found nothing to do)."""
        self.ended = True

    def finish(self) -> int | None:
        """Mark the run finished now, rather than on leaving the context."""
        self.ended = True
        return finish(self.lake, self.run_id, stage=self.stage)

    def fail(self, error: BaseException | str | None = None) -> int | None:
        """Mark the run failed now with the body's own wording of why (e.g. every episode an env error)."""
        self.ended = True
        return fail(self.lake, self.run_id, stage=self.stage, error=error)


@contextlib.contextmanager
def open(lake: Lake, kind: str, config: Any, *, run_id: str, kinds: tuple[str, ...] | None = None,
         stage: str | None = None, error: type[TrajlakeError] = TrajlakeError, lease: bool = True,
         **context: Any) -> Iterator[OpenRun]:
    """A run's life as one context (see the module docstring): find-or-refuse (`kinds`, default `(kind,)`:
    the kinds of stored run this one may resume; `error` and `context` as `find`'s), the lease (unless
    `lease=False`: then `OpenRun.take_lease` takes it once the body finds work to do), and on leaving: a run the
    body began or restarted and did not end is marked finished, or failed with the error that left the body;
    the lease is given back either way. `stage` names the writes in the snapshots' commit messages (default:
    the kind; a run of kind eval is written by collect)."""
    if kind not in KINDS:
        raise ValueError(f"unknown run kind {kind!r}; valid: {', '.join(KINDS)}")
    kinds = kinds or (kind,)
    resumed = find(lake, run_id, config, kinds=kinds, error=error, **context)  # refused before anything else
    run = OpenRun(lake, run_id, stage or kind, resumed, config, kinds, error)
    try:
        if lease:
            run.take_lease(**context)
        yield run
    except BaseException as e:
        if run.written and not run.ended:
            fail(lake, run_id, stage=run.stage, error=e)
        raise
    else:
        if run.written and not run.ended:
            finish(lake, run_id, stage=run.stage)
    finally:
        if run.lease is not None:  # ended, failed or interrupted: the next process may run it
            run.lease.release()


__all__ = ["KINDS", "OpenRun", "StoredRun", "Difference", "open", "new_run_id", "hashed_run_id", "stored", "find",
           "differences", "describe_differences", "compare", "begin", "record", "restart", "finish", "fail",
           "fail_abandoned"]
