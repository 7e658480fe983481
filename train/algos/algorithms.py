"""Training algorithms as registry entries: which loop runs each, whether it trains a critic, its default
advantage estimator and which estimators it accepts.

A TrainConfig's ``algo`` names an entry of :data:`ALGOS`; everything that depends on the algorithm reads the
entry, never its name: the config checks (``check_train_config``), the engines built (a critic when
``needs_critic``, a frozen reference when :meth:`Algo.needs_reference`), the loop ``train`` runs (``loop``)
and the field counting a run's length (``counter``). An estimator's own properties (critic, groups, turn
inputs, settings) live on its :class:`~trajlake.train.algos.core.Advantage` entry in ``ADVANTAGES``.

Adding an algorithm is one registration, e.g. REINFORCE++ as its own algo on the RL loop::

    register_algo("reinforce", loop=RL_LOOP, default_advantage="reinforce_plus_plus")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trajlake.core.registry import Registry
from trajlake.train.algos import advantages, turns  # noqa: F401  (the estimators the defaults below name)
from trajlake.train.algos.core import ADVANTAGES, Advantage

#: The RL loop: iterations of rollouts (fresh, or stored ones with train_filter), scoring, advantages and
#: clipped policy updates (train.loop.train).
RL_LOOP = "rl"
#: The supervised loop: optimizer steps of cross-entropy on the response tokens of the episodes sft_filter
#: selects (train.loop.sft).
SFT_LOOP = "sft"
#: Each loop's counter: the TrainConfig field that says how long a run of it is (and may grow on a resume).
LOOP_COUNTERS = {RL_LOOP: "iterations", SFT_LOOP: "sft_steps"}
#: The TrainConfig sections each loop reads (a run of it holds only these): SFT plays held-out evals but no
#: rollouts to learn from, so it has no advantages, KL anchor, critic, stored-rollout or async settings.
LOOP_SECTIONS = {
    RL_LOOP: ("run", "rollout", "eval", "data", "asynchronous", "algorithm", "kl", "critic", "optim", "engine",
              "checkpoint"),
    SFT_LOOP: ("run", "rollout", "eval", "optim", "engine", "checkpoint", "sft"),
}


@dataclass(frozen=True)
class Algo:
    """A registered training algorithm.

    ``loop``: the loop that runs it (:data:`RL_LOOP` or :data:`SFT_LOOP`). ``default_advantage``: the
    estimator a config without ``advantage`` uses (an SFT run computes none; its default is what its stored
    config names). ``needs_critic``: the RL loop trains a value model beside the policy, and the algo accepts
    exactly the estimators that read one (an algo without a critic accepts exactly those that do not).
    ``default_group_filter``: the group filter (GROUP_FILTERS) a config without ``group_filter`` uses.
    ``description``: one line for listings."""

    loop: str
    default_advantage: str
    needs_critic: bool = False
    description: str = ""
    default_group_filter: str = "all"

    def __post_init__(self):
        if self.loop not in LOOP_COUNTERS:
            raise ValueError(f"an algo runs in one of the loops {', '.join(LOOP_COUNTERS)}, got {self.loop!r}")
        if self.needs_critic and self.loop != RL_LOOP:
            raise ValueError(f"only the {RL_LOOP} loop trains a critic; the {self.loop} loop has none")

    @property
    def counter(self) -> str:
        """The TrainConfig field counting a run of this algo: ``iterations`` or ``sft_steps``."""
        return LOOP_COUNTERS[self.loop]

    @property
    def sections(self) -> tuple[str, ...]:
        """The TrainConfig sections a run of this algo holds (its loop's)."""
        return LOOP_SECTIONS[self.loop]

    @property
    def uses_advantages(self) -> bool:
        """Whether a run computes advantages (the RL loop does; SFT trains on the episodes' tokens alone)."""
        return self.loop == RL_LOOP

    def accepts(self, advantage: Advantage) -> bool:
        """Whether a config may pair this algo with `advantage`: a critic for exactly the estimators reading one
        (any estimator for a loop that computes none)."""
        return not self.uses_advantages or advantage.needs_critic == self.needs_critic

    def needs_reference(self, config: Any) -> bool:
        """Whether a run of `config` (a TrainConfig) builds a frozen reference policy: the RL loop does for a KL
        penalty (``kl_coef > 0``), whatever the algo."""
        return self.loop == RL_LOOP and config.kl.coef > 0


ALGOS: Registry[Algo] = Registry("algo")


def register_algo(name: str, *aliases: str, loop: str, default_advantage: str, needs_critic: bool = False,
                  description: str = "", default_group_filter: str = "all") -> Algo:
    """Register an :class:`Algo` under ``name`` (and ``aliases``) and return it. Its default estimator must be
    registered and accepted by it (a programming error otherwise: ValueError, or UnknownNameError naming the
    valid estimators)."""
    algo = Algo(loop, default_advantage, needs_critic, description, default_group_filter)
    if not algo.accepts(ADVANTAGES[default_advantage]):
        raise ValueError(f"algo {name!r} (needs_critic={needs_critic}) does not accept its own default advantage "
                         f"{default_advantage!r}")
    return ALGOS.add(name, algo, *aliases)


def algos_accepting(advantage: Advantage) -> list[str]:
    """The names of the RL algos that accept `advantage`, sorted: what a refused config is told to use."""
    return [n for n in ALGOS.names() if ALGOS[n].uses_advantages and ALGOS[n].accepts(advantage)]


class _DefaultAdvantages(Mapping[str, str]):
    """``{algo name: its default advantage}``, read from :data:`ALGOS` at each lookup (so an algo registered
    later is in it); an unknown algo is a KeyError (:class:`UnknownNameError`), so ``.get`` gives the default."""

    def __getitem__(self, algo: str) -> str:
        return ALGOS[algo].default_advantage

    def __iter__(self) -> Iterator[str]:
        return iter(ALGOS)

    def __len__(self) -> int:
        return len(ALGOS)


#: Each algo's default advantage estimator, a live view of :data:`ALGOS`.
DEFAULT_ADVANTAGE: Mapping[str, str] = _DefaultAdvantages()

register_algo("grpo", loop=RL_LOOP, default_advantage="grpo", default_group_filter="outcome_differs",
              description="critic-free RL: any estimator without a critic (grpo, rloo, gigpo, reinforce++, ...)")
register_algo("ppo", loop=RL_LOOP, default_advantage="gae", needs_critic=True,
              description="RL with a critic trained beside the policy: the estimators reading values (gae, ...)")
register_algo("sft", loop=SFT_LOOP, default_advantage="grpo",
              description="supervised fine-tuning on the response tokens of the episodes sft_filter selects")

__all__ = ["ALGOS", "Algo", "register_algo", "algos_accepting", "DEFAULT_ADVANTAGE", "RL_LOOP", "SFT_LOOP",
           "LOOP_COUNTERS"]
