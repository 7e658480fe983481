"""The train stage's configuration: TrainConfig, a dataclass of sections (train/config_sections.py,
train/config_update.py), every field documented, checked at construction.

`load_config(path)` reads it from TOML (each field in its section's table, `[kl] coef = 0.01`, or at the top level
by its flat name, `kl_coef = 0.01`; an unknown key is an error naming it). `TrainConfig(...)` raises
`ConfigError` naming the field when a value has the wrong type (checked from the annotations), when a number is not
finite or out of its range, and saying what to fix when fields disagree with each other (the rules:
train/config_checks.py).

A run's settings are stored once, in its `runs.config` row; restarting the same run id resumes it only with
the same RUN_FIELDS (see `TrainConfig.differences` and RESUMABLE_FIELDS below).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trajlake.core.config_types import (
    HELP,
    SECTION,
    added_fields,
    leaf_fields,
    leaf_values,
    operational_fields,
    run_fields,
    section,
)
from trajlake.core.errors import TrajlakeError
from trajlake.core.text_files import read_text_file
from trajlake.store.runs import differences
from trajlake.train.config_checks import (  # noqa: F401  (the constants are this module's API too)
    DTYPES,
    MAX_COUNT,
    ConfigError,
    check_numbers,
    check_train_config,
    group_filter_of,
    registries,
)
from trajlake.train.config_sections import (
    AsyncSection,
    CheckpointSection,
    DataSection,
    EngineSection,
    EvalSection,
    RolloutSection,
    RunSection,
    SFTSection,
)
from trajlake.train.config_update import AlgorithmSection, CriticSection, KLSection, OptimSection

#: the train configs the package ships (the recipes' and the docs')
CONFIGS_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What `trajlake train` trains, on what data, and how: one section per concern (train/config_sections.py,
    train/config_update.py), `cfg.kl.coef` in code.

    A run id is one run: restarting it resumes from its last checkpoint, and only with the settings it was
    started with (RUN_FIELDS: every field but RESUMABLE_FIELDS; `model` is compared as the policy it resolves
    to). What may differ on a restart is how the run is carried out, not what it trains: `iterations` and
    `sft_steps` (extend a run; never below the steps it has done), `env_url`, `concurrency`, `micro_batch`,
    `grad_accum`, `checkpoint_dir`, `save_optimizer`, `checkpoint_every`, `log_every`, `eval_every` and
    `progress`. The run's `runs.config` then records the values of the latest restart.

    A run holds the sections its algo uses (`Algo.sections`: SFT has no kl, critic, algorithm, data or
    asynchronous section, RL none for sft); the others are None, and one given with a value other than its
    default is refused, naming the field. A section may be given as a mapping of its fields
    (`TrainConfig(run={"model": "m"}, kl={"coef": 0.01})`). `temperature` must be > 0 here (log-probs in
    training use logits / temperature too).
    """

    config_name: ClassVar[str] = "train config"
    error_type: ClassVar[type[TrajlakeError]] = ConfigError

    run: RunSection = field(metadata={SECTION: RunSection, HELP: RunSection.__doc__})
    rollout: RolloutSection | None = section(RolloutSection, help=RolloutSection.__doc__)
    eval: EvalSection | None = section(EvalSection, help=EvalSection.__doc__)
    data: DataSection | None = section(DataSection, help=DataSection.__doc__)
    asynchronous: AsyncSection | None = section(AsyncSection, help=AsyncSection.__doc__)
    algorithm: AlgorithmSection | None = section(AlgorithmSection, help=AlgorithmSection.__doc__)
    kl: KLSection | None = section(KLSection, help=KLSection.__doc__)
    critic: CriticSection | None = section(CriticSection, help=CriticSection.__doc__)
    optim: OptimSection | None = section(OptimSection, help=OptimSection.__doc__)
    engine: EngineSection | None = section(EngineSection, help=EngineSection.__doc__)
    checkpoint: CheckpointSection | None = section(CheckpointSection, help=CheckpointSection.__doc__)
    sft: SFTSection | None = section(SFTSection, help=SFTSection.__doc__)

    def __post_init__(self):
        # the sections first (each checked its fields' types when made), then those the algo does not use left
        # out, then the numbers' ranges (before any rule divides by one), then the rules across fields
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _section_of(f, getattr(self, f.name)))
        uses = self._algo().sections
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in uses and value is None:
                object.__setattr__(self, f.name, f.metadata[SECTION]())
            elif f.name not in uses and value is not None:
                defaults = leaf_values(type(value)())
                given = [name for name, v in leaf_values(value).items() if v != defaults[name]]
                if given:
                    raise ConfigError(f"train config: algo {self.run.algo} has no [{f.name}] section; leave out "
                                      f"{', '.join(given)}")
                object.__setattr__(self, f.name, None)
        check_numbers(self)
        check_train_config(self)

    def _algo(self):
        algos = registries().ALGOS
        if self.run.algo not in algos:
            raise ConfigError(f"train config: algo must be one of {', '.join(algos.names())}, got {self.run.algo!r}")
        return algos[self.run.algo]

    # ---- derived ------------------------------------------------------------------------------------
    @property
    def group_filter_name(self) -> str:
        """The group filter used (the algo's registered default when `group_filter` is None)."""
        return group_filter_of(self.run.algo, self.algorithm.advantage, self.algorithm.group_filter)

    @property
    def advantage_name(self) -> str:
        """The advantage estimator used (the algo's registered default when `advantage` is None)."""
        return self.algorithm.advantage or self._algo().default_advantage

    def turns_at(self, iteration: int) -> int:
        """The turn cap of iteration `iteration`'s (from 0) rollouts under the horizon curriculum."""
        r = self.rollout
        return horizon(iteration, r.horizon_start, r.horizon_every, r.max_turns)

    @property
    def norm_constant(self) -> float:
        return float(self.optim.loss_norm_constant or self.rollout.max_new_tokens * self.rollout.max_turns)

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step per process for `world_size` processes."""
        o = self.optim
        per = o.micro_batch * world_size
        if o.grad_accum is not None:
            if o.micro_batch * o.grad_accum * world_size != o.minibatch_size:
                raise ConfigError(
                    f"train config: minibatch_size ({o.minibatch_size}) != micro_batch ({o.micro_batch}) * "
                    f"grad_accum ({o.grad_accum}) * processes ({world_size}); fix one or unset grad_accum")
            return o.grad_accum
        if o.minibatch_size % per:
            raise ConfigError(f"train config: minibatch_size ({o.minibatch_size}) is not a multiple of "
                              f"micro_batch * processes ({o.micro_batch} * {world_size})")
        return o.minibatch_size // per

    # ---- by flat name ---------------------------------------------------------------------------------
    def value(self, name: str) -> Any:
        """A field's value by its flat name (`kl_coef`), for code that names fields in tables (the checks'
        ranges, an algo's counter); None for a field of a section the run leaves out."""
        key, short = LEAVES[name]
        holder = getattr(self, key)
        return None if holder is None else getattr(holder, short)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes`, each by flat name (`kl_coef=0.01`) or a whole section by its key (a mapping
        of its fields, merged into the section's values), checked again."""
        return config_from_dict({**self.to_dict(), **flatten(changes, "train config")})

    def to_dict(self) -> dict[str, Any]:
        """The config as a run stores it: {flat name: value} of the sections the run holds."""
        return leaf_values(self)

    def differences(self, stored: dict[str, Any], *, start_policy: str | None = None,
                    spec_id: str | None = None) -> list[tuple[str, Any, Any]]:
        """(field, stored value, given value) for each of RUN_FIELDS where this config differs from the `stored`
        config of the run it would resume (`runs.config`; trajlake.store.runs.differences). `model` is compared
        as the policy it resolves to (`start_policy`, stored beside the config), so `run:ID`, `policy:ID` and the
        folder of one checkpoint are the same start, and `run:ID` is not once that run has trained on.
        `reward_spec` is compared by its content (`spec_id`, stored beside the config as `reward_spec_id`), so
        an edited spec file at the same path is a different run and a copy at another path is the same. A field
        the stored config lacks (a lake from before it existed) is not compared, except those declared
        `added_later` (ADDED_FIELDS): compared with the value that run played by."""
        reg = registries()

        def adjust(name: str, old: Any, new: Any) -> tuple[Any, Any] | None:
            if name == "model" and start_policy and stored.get("start_policy"):
                if stored["start_policy"] == start_policy:
                    return None
                return f"{old} (policy {stored['start_policy']})", f"{new} (policy {start_policy})"
            if name == "reward_spec" and spec_id and stored.get("reward_spec_id"):
                if stored["reward_spec_id"] == spec_id:
                    return None
                return f"{old} (spec {stored['reward_spec_id']})", f"{new} (spec {spec_id})"
            if name == "advantage":  # None is the algo's default: compare the estimators actually used
                return old or reg.DEFAULT_ADVANTAGE.get(stored.get("algo", self.run.algo), old), self.advantage_name
            if name == "group_filter":  # likewise (a run stored before the filter existed kept every group)
                algo = stored.get("algo", self.run.algo)
                used = old or (group_filter_of(algo, stored.get("advantage"), old) if algo in reg.ALGOS else old)
                return used, self.group_filter_name
            return old, new

        return differences(stored, self, adjust=adjust)


#: flat name -> (section key, the field's name in its section), for every leaf of TrainConfig
LEAVES: dict[str, tuple[str, str]] = {name: path for name, path, _ in leaf_fields(TrainConfig)}
FIELDS = set(LEAVES)
#: section key -> its class, in TrainConfig's order
SECTIONS: dict[str, type] = {f.name: f.metadata[SECTION] for f in dataclasses.fields(TrainConfig)}
#: section tables renamed since configs were written with them: old key -> new key
RENAMED_SECTIONS = {"async": "asynchronous"}


def dotted(name: str) -> str:
    """A field's dotted name from its flat name: `kl_coef` is `kl.coef`, `lr` is `optim.lr`."""
    return ".".join(LEAVES[name])


# How a run is carried out, not what it trains, is declared `operational` on its field: it may differ when a run
# id is restarted. iterations and sft_steps extend (or end sooner) the same run; env_url says where the env
# server is now, not which env it serves; concurrency is how many episodes play at once, replicas on how many
# policy copies, rollout_engine with what (a restart may move to a machine with vLLM); micro_batch and
# grad_accum split a mini-batch over forward passes and processes (the losses are aggregated over the whole
# mini-batch, so the update is the same); checkpoint_dir, save_optimizer and checkpoint_every say where and how
# often checkpoints are written (a restart finds the last one through the store); log_every, eval_every,
# progress and report_to are what the run reports and where; run_id is the key itself.
RESUMABLE_FIELDS = operational_fields(TrainConfig)
# What makes a train run the run it is: every other field (the starting model, the data and rollouts, the
# reward spec, the algorithm and its hyper-parameters, seed, precision, ZeRO stage, the held-out evals). A
# restart with any of them changed would continue one run's weights, optimizer state and train_steps under
# other settings while its runs.config described the first ones, so it is refused; a new field is one of these
# unless it is declared `operational`.
RUN_FIELDS = run_fields(TrainConfig)
# RUN_FIELDS declared `added_later`: added after train runs were stored, with the value that keeps the old
# meaning: a stored config without one was played by that value (every iteration at max_turns before the
# horizon curriculum), so a restart at it resumes the run and a restart at another is refused like any other
# changed RUN_FIELD.
ADDED_FIELDS = added_fields(TrainConfig)


def horizon(iteration: int, start: int, every: int, max_turns: int) -> int:
    """The turn cap of iteration `iteration` (from 0) under the horizon curriculum: `start` turns, one more
    every `every` iterations, never above `max_turns`; `start` 0 (the curriculum off) is max_turns throughout.
    E.g. start 2, every 3, max_turns 4: iterations 0-2 play 2 turns, 3-5 play 3, 6 and after play 4."""
    if start == 0:
        return max_turns
    return min(max_turns, start + iteration // every)


def config_from_dict(data: Mapping[str, Any], source: str | None = None) -> TrainConfig:
    """A TrainConfig from a mapping of flat names (`kl_coef`), section tables (`"kl": {"coef": 0.01}`) or both;
    an unknown key, or a field given twice, is an error naming it (and `source`, where the mapping came from)."""
    flat = flatten(data, source or "train config")
    if "model" not in flat:
        raise ConfigError(f"{source or 'train config'}: `model` is required (a model folder or policy:ID)")
    tables: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        key, short = LEAVES[name]
        tables.setdefault(key, {})[short] = value
    try:
        return TrainConfig(**tables)
    except ConfigError as e:
        if source is None:
            raise
        raise ConfigError(f"{source}: {e}") from None


def config_from_stored(stored: Mapping[str, Any], source: str, **changes: Any) -> TrainConfig:
    """The TrainConfig of a run's stored config (`runs.config`, keyed by flat names) with `changes`: its fields
    of the sections its algo uses, so a config stored before the sections (which holds every field, an RL run's
    `sft_steps` too) reads back as the run it was; the keys stored beside the fields (`start_policy`, ...) left
    out."""
    algos = registries().ALGOS
    algo = stored.get("algo", RunSection.algo)  # the default algo, for a config stored without one
    uses = algos[algo].sections if algo in algos else tuple(SECTIONS)
    fields = {k: v for k, v in stored.items() if k in FIELDS and LEAVES[k][0] in uses}
    return config_from_dict({**fields, **changes}, source)


def flatten(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A mapping of flat names and section tables (a TOML file's, or `replace`'s changes) as flat names: each
    table's keys by their flat names, the top level's as they are; a section given as a Section instance counts
    as its table. ConfigError (one line, naming `where`) for an unknown section or key, and for a field given
    both at the top level and in its section's table."""
    flat = {k: v for k, v in data.items() if k not in SECTIONS}
    unknown = sorted(set(flat) - FIELDS)
    for key in unknown:
        if key in RENAMED_SECTIONS:
            raise ConfigError(f"{where}: the [{key}] section is now [{RENAMED_SECTIONS[key]}]; rename the table")
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(FIELDS))} "
                          f"(or the sections {', '.join(SECTIONS)})")
    for key, table in data.items():
        if key not in SECTIONS or table is None:
            continue
        cls = SECTIONS[key]
        if isinstance(table, cls):
            table = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: [{key}] must be a table of its fields, got {table!r}")
        for short, value in table.items():
            if (key, short) not in _FLAT_OF:
                valid = ", ".join(short for (k, short) in _FLAT_OF if k == key)
                raise ConfigError(f"{where}: [{key}] has no key {short!r}; valid: {valid}")
            name = _FLAT_OF[key, short]
            if name in data:
                raise ConfigError(f"{where}: {name} is given twice, at the top level and as {short} in [{key}]")
            flat[name] = value
    return flat


#: (section key, field name in it) -> flat name
_FLAT_OF = {path: name for name, path in LEAVES.items()}


def _section_of(f: dataclasses.Field, value: Any) -> Any:
    """TrainConfig's field `f` as its section: a mapping of its fields made into one (unknown keys refused),
    an instance or None kept; anything else refused."""
    cls = f.metadata[SECTION]
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {g.name for g in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"train config: [{f.name}] has no key {unknown[0]!r}; valid: "
                              f"{', '.join(g.name for g in dataclasses.fields(cls))}")
        return cls(**value)
    raise ConfigError(f"train config: [{f.name}] must be a table of its fields, got {value!r}")


def load_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """Read a TrainConfig from a TOML file (each field in its section's table, or at the top level by its flat
    name); `overrides` (by flat name; not None) replace file values."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text_file(path, "train config", error=ConfigError))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{path}: not a train config: its values nest too deep for TOML's reader") from None
    data = flatten(data, str(path))
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data, str(path))


__all__ = ["TrainConfig", "CONFIGS_DIR", "ConfigError", "load_config", "config_from_dict", "config_from_stored",
           "flatten", "dotted",
           "LEAVES", "SECTIONS", "RUN_FIELDS", "RESUMABLE_FIELDS", "ADDED_FIELDS", "horizon"]
