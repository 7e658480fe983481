"""The one line each benchmark contributes to `make bench`'s table: what was compared, both sides' numbers, the
ratio, and the target it is held to.

Every bench script takes `--json PATH` and writes there a list of `Headline` rows (`write_rows`); `bench/suite.py`
runs the scripts one after another and joins their rows into one table (markdown and JSON). A row's `ratio`
is always "how many times better trajlake is" (> 1 is better), whatever the unit: for a time it is
alternative / trajlake, for a rate trajlake / alternative.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Headline:
    """One compared measurement of one stage."""

    stage: str
    """Which stage and size, e.g. "collect: 32 episodes x 6 turns, tiny model"."""
    trajlake: str
    """What trajlake's side is ("batched loop, concurrency 32")."""
    alternative: str
    """The baseline it is compared with, measured in the same process ("one sequence at a time")."""
    trajlake_value: float
    """trajlake's number, in `unit`."""
    alternative_value: float
    """The baseline's number, in `unit`."""
    unit: str
    """"s" (lower is better) or a rate such as "episodes/s" or "tokens/s" (higher is better)."""
    target: float
    """The ratio the stage is held to (issue 26's table); `met` compares against it."""
    note: str = ""
    """Anything the number needs beside it (rounds, sizes, why a target is not met)."""
    extra: dict = field(default_factory=dict)
    """The bench's own details (per-side counts), kept in the JSON only."""

    @property
    def lower_is_better(self) -> bool:
        return self.unit in ("s", "seconds", "ms")

    @property
    def ratio(self) -> float:
        """How many times better trajlake is than the alternative (> 1: trajlake is better)."""
        a, t = self.alternative_value, self.trajlake_value
        if self.lower_is_better:
            return a / t if t else float("inf")
        return t / a if a else float("inf")

    @property
    def met(self) -> bool:
        return self.ratio >= self.target

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": round(self.ratio, 3), "met": self.met}


def write_rows(path: str | Path | None, rows: list[Headline]) -> None:
    """Write `rows` as JSON to `path` (nothing when `path` is None: the script was run by hand)."""
    if path is None:
        return
    Path(path).write_text(json.dumps([r.as_dict() for r in rows], indent=2))


def read_rows(path: str | Path) -> list[dict]:
    return json.loads(Path(path).read_text())


def add_json_option(parser) -> None:
    """The `--json PATH` option every bench script takes."""
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write this run's headline rows (bench/headline.py) to PATH, for make bench")
