"""No module outside the registries compares a registry entry's name: what an entry does is asked of the entry
(its hooks and declared rules), so a new entry is one registration and never an edit of code that names the
others. Read from the source with `ast`: every comparison (`==`, `!=`, `in`, `not in`) of a string that some
registry holds as a name with an expression that reads a registry-valued setting (TrainConfig's `algo`,
`advantage`, `kl_mode`..., a spec's `strategy`, a catalog's `kind`) fails the test, wherever it sits outside the
module that declares that registry."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from tests.test_layering import PACKAGE, ROOT, _modules
from trajlake.core.registry import Registry

#: the settings whose values are registry entry names (TrainConfig's fields and the other stages' equivalents);
#: an expression that reads one of these and is compared with an entry's name is a name comparison
REGISTRY_SETTINGS = ("algo", "advantage", "policy_loss", "value_loss", "agg_mode", "group_filter", "kl_estimator",
                     "kl_mode", "kl_controller", "old_logprobs", "task_selector", "rollout_engine", "report_to",
                     "tracker", "strategy", "allocation", "scheme", "backend", "catalog", "engine", "estimator",
                     "selector", "kind")
SETTING_READ = re.compile(r"\b(" + "|".join(REGISTRY_SETTINGS) + r")\b")


def _registries() -> dict[str, list[tuple[str, Registry]]]:
    """Every registry of the package, found in the modules whose source declares one: module -> (where, registry),
    module-level ones and those held by a class."""
    found: dict[str, list[tuple[str, Registry]]] = {}
    for name, path in _modules().items():
        if "Registry(" not in path.read_text() or name == f"{PACKAGE}.core.registry":
            continue
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            holders = [(attr, value)] + [(f"{attr}.{a}", v) for a, v in vars(value).items()] \
                if isinstance(value, type) and value.__module__ == name else [(attr, value)]
            for where, obj in holders:
                if isinstance(obj, Registry):
                    found.setdefault(name, []).append((where, obj))
    return found


def _entry_names(registries: dict[str, list[tuple[str, Registry]]]) -> dict[str, set[str]]:
    """entry name -> the modules declaring a registry that holds it"""
    names: dict[str, set[str]] = {}
    for module, held in registries.items():
        for _, registry in held:
            for entry in registry.names():
                names.setdefault(entry, set()).add(module)
    return names


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def name_comparisons(source: str, names: dict[str, set[str]], module: str) -> list[str]:
    """`line: text` of each comparison in `source` of an entry name (of a registry `module` does not declare)
    with an expression that reads a registry-valued setting."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        compared = [s for side in sides for s in _strings(side) if s in names and module not in names[s]]
        reads_setting = any(SETTING_READ.search(ast.unparse(side)) for side in sides if not _strings(side))
        if compared and reads_setting:
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_the_registries_are_found():
    registries = _registries()
    kinds = {registry.kind for held in registries.values() for _, registry in held}
    for kind in ("algo", "advantage estimator", "policy loss", "KL controller", "allocation strategy", "env",
                 "task selector", "rollout engine", "catalog backend", "component kind"):
        assert kind in kinds, f"no registry of {kind}s found"
    assert {"grpo", "k3", "last_token", "frontier", "doors"} <= set(_entry_names(registries))


def test_no_module_outside_the_registries_compares_an_entrys_name():
    names = _entry_names(_registries())
    offenders = [f"{path.relative_to(ROOT)}:{hit}" for module, path in _modules().items()
                 for hit in name_comparisons(path.read_text(), names, module)]
    assert not offenders, ("entry names compared outside their registry (ask the entry instead):\n"
                           + "\n".join(offenders))


def test_a_name_comparison_is_seen_wherever_it_sits():
    names = {"grpo": {"trajlake.train.algos.algorithms"}, "k3": {"trajlake.train.algos.core"}}
    source = ("def f(cfg, c):\n"
              "    if cfg.run.algo == 'grpo': pass\n"
              "    x = [1 for e in c if e.kl_estimator in ('k3', 'k1')]\n"
              "    return lambda s: 'grpo' != s.algo\n")
    assert [hit.split(":")[0] for hit in name_comparisons(source, names, "trajlake.cli.x")] == ["2", "3", "4"]
    # the module that declares the registry may; a string that is no setting's value is no entry comparison
    assert name_comparisons(source, names, "trajlake.train.algos.algorithms") == ["3: e.kl_estimator in ('k3', 'k1')"]
    assert name_comparisons("if difficulty == 'grpo': pass\n", names, "trajlake.cli.x") == []


def test_the_walk_reads_every_library_module():
    assert Path(ROOT / "train" / "loop.py") in _modules().values()
