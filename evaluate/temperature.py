"""Choosing a policy's rollout temperature by measurement: evaluate it greedily and at each temperature of a
sweep on the same held-out tasks (val by default), and keep the most exploration it survives.

Why: a small model's success can collapse when RL samples hot. SmolLM2-135M after SFT on TextCraft won 13 of 30
goals greedily, 12 at T=0.5, 9 at T=0.7 and 2 at T=1.0: sampling at the usual T=1.0 would have trained on
almost nothing but failures. The temperature is a measured setting, recorded with the run.

Every point of a sweep is a plain eval run (`trajlake.evaluate.run.evaluate`), stored in the lake under its
hashed run id: the greedy point is the run `trajlake evaluate --greedy` makes with the same settings, and a
second sweep reads every point back instead of replaying it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl

from trajlake.collect.config import MAX_TEMPERATURE
from trajlake.core.errors import TrajlakeError
from trajlake.evaluate.config import EvalConfig
from trajlake.evaluate.metrics import wilson_interval
from trajlake.evaluate.run import evaluate
from trajlake.store import Lake

#: the most temperatures one sweep plays (each is a whole evaluation)
MAX_SWEEP = 8
#: the two-sided level of greedy's interval the choice rule compares against
CHOICE_CONFIDENCE = 0.95
#: float slack when a rate is compared with a bound computed from it (12/30 against itself)
_EPS = 1e-12


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One point of a sweep: the greedy evaluation (`temperature` None) or one sampled at `temperature`, with
    its episodes (env errors left out), successes and eval run id. Its interval is the Wilson 95% one."""

    temperature: float | None
    episodes: int
    successes: int
    run_id: str = ""

    def __post_init__(self):
        if self.episodes < 1 or not 0 <= self.successes <= self.episodes:  # a point without episodes says nothing
            raise TrajlakeError(f"temperature sweep: a point needs 0 <= successes <= episodes and episodes >= 1, got "
                                f"{self.successes} of {self.episodes}")

    @property
    def label(self) -> str:
        """`greedy` or the temperature (`0.5`, `1.0`)."""
        return "greedy" if self.temperature is None else str(self.temperature)

    @property
    def success(self) -> float:
        return self.successes / self.episodes

    @property
    def interval(self) -> tuple[float, float]:
        """The Wilson interval at CHOICE_CONFIDENCE (sensible at 0 and all successes)."""
        return wilson_interval(self.successes, self.episodes, CHOICE_CONFIDENCE)

    @property
    def low(self) -> float:
        return self.interval[0]

    @property
    def high(self) -> float:
        return self.interval[1]


def _split_points(points: Iterable[SweepPoint]) -> tuple[SweepPoint, list[SweepPoint]]:
    """(the greedy point, the sampled ones by temperature): exactly one greedy point and at least one sampled,
    no temperature twice; anything else is a sweep the rule cannot read."""
    points = list(points)
    greedy = [p for p in points if p.temperature is None]
    sampled = sorted((p for p in points if p.temperature is not None), key=lambda p: p.temperature)
    if len(greedy) != 1:
        raise TrajlakeError(f"temperature sweep: the choice needs exactly one greedy point, got {len(greedy)}")
    if not sampled:
        raise TrajlakeError("temperature sweep: the choice needs at least one sampled temperature")
    temps = [p.temperature for p in sampled]
    if len(set(temps)) != len(temps):
        raise TrajlakeError(f"temperature sweep: a temperature is given twice: {', '.join(f'{t:g}' for t in temps)}")
    return greedy[0], sampled


def kept_temperatures(points: Iterable[SweepPoint], confidence: float = CHOICE_CONFIDENCE) -> list[float]:
    """The swept temperatures whose sampled success is not below the lower end of greedy success's Wilson
    interval at `confidence` (ascending): those the data cannot tell from greedy's success, or better."""
    greedy, sampled = _split_points(points)
    low = wilson_interval(greedy.successes, greedy.episodes, confidence)[0]
    return [p.temperature for p in sampled if p.success >= low - _EPS]


def choose_temperature(points: Iterable[SweepPoint], confidence: float = CHOICE_CONFIDENCE) -> float:
    """The rollout temperature a sweep chooses.

    Rule: the highest swept temperature whose sampled success is not below the lower end of the greedy
    success's Wilson interval at `confidence` (95%): the most exploration the model survives, where "survives"
    means its success cannot be told from greedy's (or beats it) at that level. If no temperature qualifies,
    the lowest one swept (the least damage among those measured).

    Edge cases:
    - "not below" is `>=`: a sampled success equal to the bound qualifies.
    - Greedy with 0 successes has a lower bound of 0, so every temperature qualifies and the highest is
      chosen (an all-zero table chooses the highest: greedy has no success to lose, and exploration is the
      only way to find one).
    - Qualifying temperatures need not be contiguous: a noisy dip at a middle temperature does not stop a
      higher one that qualifies from being chosen (each is judged against greedy alone).
    - The order of `points` does not matter; points may have different episode counts (samples per task),
      as each is compared by its rate.
    - Exactly one greedy point (temperature None) and at least one sampled one, no temperature twice:
      anything else is refused (TrajlakeError).

    The interval is wide on few tasks (about +-0.17 on 30): a sweep on more tasks tells smaller losses apart.
    """
    points = list(points)
    kept = kept_temperatures(points, confidence)
    return kept[-1] if kept else _split_points(points)[1][0].temperature


def check_temperatures(values: Sequence, what: str = "temperature sweep") -> tuple[float, ...]:
    """`values` as a tuple of floats, or the first problem as one line beginning with `what`: at least one and
    at most MAX_SWEEP (each is a whole evaluation), each a finite number in (0, MAX_TEMPERATURE] (0 is the
    greedy point, played anyway), none twice."""
    if not values:
        raise TrajlakeError(f"{what}: give at least one temperature (e.g. 0.3,0.5,0.7,1.0)")
    if len(values) > MAX_SWEEP:
        raise TrajlakeError(f"{what}: at most {MAX_SWEEP} temperatures (each is a whole evaluation), got {len(values)}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TrajlakeError(f"{what}: {v!r} is not a number")
        v = float(v)
        if not math.isfinite(v):
            raise TrajlakeError(f"{what}: a temperature must be a finite number, got {v}")
        if not 0 < v <= MAX_TEMPERATURE:
            raise TrajlakeError(f"{what}: a temperature must be in (0, {MAX_TEMPERATURE:g}] (greedy is always "
                                f"played as the baseline), got {v:g}")
        if v in out:
            raise TrajlakeError(f"{what}: temperature {v:g} is given twice")
        out.append(v)
    return tuple(out)


def parse_temperatures(text: str, what: str = "--temperatures") -> tuple[float, ...]:
    """`0.3,0.5,0.7,1.0` -> (0.3, 0.5, 0.7, 1.0), checked as check_temperatures does; a value that is not a
    number is named in the one-line error."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    values = []
    for p in parts:
        try:
            values.append(float(p))
        except ValueError:
            shown = repr(p) if p else "an empty value"
            raise TrajlakeError(f"{what}: {shown} is not a number (give temperatures like 0.3,0.5,0.7,1.0)") from None
    return check_temperatures(values, what)


@dataclass(frozen=True)
class SweepResult:
    """A sweep: its points (greedy first, then by temperature), the chosen temperature, and notes from the
    evaluations (contamination, env errors), each naming its point."""

    points: tuple[SweepPoint, ...]
    chosen: float
    notes: tuple[str, ...] = ()

    @property
    def greedy(self) -> SweepPoint:
        return next(p for p in self.points if p.temperature is None)

    @property
    def table(self) -> pl.DataFrame:
        """One row per point for display: success with its Wilson 95% interval, whether it is kept by the rule
        (not below greedy's lower bound; null for greedy itself), which one is chosen, and its eval run."""
        kept = set(kept_temperatures(self.points))
        return pl.DataFrame([
            {"temperature": p.label, "episodes": p.episodes, "successes": p.successes,
             "success": f"{p.success:.2f} [{p.low:.2f}, {p.high:.2f}]",
             "kept": None if p.temperature is None else p.temperature in kept,
             "chosen": p.temperature == self.chosen, "eval_run": p.run_id}
            for p in self.points
        ], schema_overrides={"kept": pl.Boolean})


def sweep_configs(base: EvalConfig, policy: str, temperatures: Sequence[float], top_p: float | None = None, *,
                  split: str = "val") -> list[tuple[float | None, EvalConfig]]:
    """The eval config of each point, all built (and so checked) before any is played: greedy as `trajlake
    evaluate --greedy` would play it with `base`'s settings (one sample per task), then each temperature with
    `base`'s samples and `top_p` (None: base's)."""
    temps = sorted(check_temperatures(temperatures))
    common = dict(policies=(policy,), split=split)
    greedy = dataclasses.replace(base, **common, greedy=True, samples=1, ks=(1,))
    sampled = [(t, dataclasses.replace(base, **common, greedy=False, temperature=t,
                                       top_p=base.top_p if top_p is None else top_p)) for t in temps]
    return [(None, greedy), *sampled]


def _point(temperature: float | None, config: EvalConfig, lake: Lake) -> tuple[SweepPoint, list[str]]:
    """Evaluate (or read back) one point: its overall row of the eval summary, and the eval's notes."""
    result = evaluate(config, lake)
    row = result.summary.filter(pl.col("difficulty") == "all").row(0, named=True)
    n = int(row["episodes"])
    point = SweepPoint(temperature=temperature, episodes=n, successes=round(row["success_rate"] * n),
                       run_id=next(iter(result.runs.values())))
    return point, [f"{point.label}: {note}" for note in result.notes]


def sweep_temperatures(lake: Lake, base: EvalConfig, policy: str, temperatures: tuple[float, ...],
                       top_p: float | None = None, *, split: str = "val") -> SweepResult:
    """Evaluate `policy` greedily and at each of `temperatures` on the same tasks (`base`'s tasks, difficulty,
    seed and rollout settings, on `split`: val by default, as a temperature tuned on the test split would make
    the test numbers no longer held out; `base.split` and `base.policies` are not used), and choose the
    temperature by `choose_temperature`. Each point is a stored eval run: a sweep run again reads them back."""
    configs = sweep_configs(base, policy, temperatures, top_p, split=split)
    points, notes = [], []
    for temperature, config in configs:
        point, said = _point(temperature, config, lake)
        points.append(point)
        notes += said
    return SweepResult(points=tuple(points), chosen=choose_temperature(points), notes=tuple(notes))


__all__ = ["SweepPoint", "SweepResult", "sweep_temperatures", "choose_temperature", "kept_temperatures",
           "check_temperatures", "parse_temperatures", "sweep_configs", "MAX_SWEEP"]
