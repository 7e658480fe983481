"""Helpers shared by the test modules (no tests here): the session's tiny models, collect and train configs
for small runs, queries of what a run stored, and synthetic episodes."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import torch

from trajlake.collect.chat import ChatRenderer, full_sequence
from trajlake.collect.config import CollectConfig
from trajlake.collect.policies.hf import HFPolicy
from trajlake.collect.rollout import collect
from trajlake.lm.build import build_tiny_model
from trajlake.rewards import SPECS_DIR, default_spec, load_spec
from trajlake.rewards.score import score
from trajlake.schemas.records import Policy, Run, TrainStep
from trajlake.store import Lake
from trajlake.train.batch import EpisodeSeq
from trajlake.train.config import TrainConfig, config_from_dict

EOT = "<|im_end|>"
#: the built-in envs (the registry may hold more: third-party ones, made only when their package is installed)
BUILTIN = ("crafting", "doors", "guess", "maze")
#: what the "taught" model replies, whatever it is asked (greedy; at temperature 1 almost always)
TAUGHT_REPLY = "guess 5"

SYSTEM = "Open the door with the key. Reply as <action>open COLOR</action>."

VARIED_SPEC = """
name = "test-varied"
[allocation]
strategy = "last_token"
[[components]]
kind = "sql"
weight = 1.0
expr = "sample_index % 2"
"""


def tiny_model_dir(tmp_path_factory) -> Path:
    """The random-weight tiny model, built once per session."""
    path = tmp_path_factory.getbasetemp() / "tiny-model"
    if not (path / "model.safetensors").is_file():
        build_tiny_model(path)
    return path


def taught_model_dir(tmp_path_factory) -> Path:
    """A real Llama checkpoint (the tiny model's body and tokenizer) whose weights make it reply TAUGHT_REPLY
    and then the end-of-turn token, whatever the prompt.

    The blocks' residual writes are scaled down 100x, so the last hidden state is (almost) the normalised
    embedding of the current token, and an untied lm_head maps the tokens of "\\n" + REPLY to their
    successors (the generation prompt ends with "\\n") with a logit margin of 12. Every layer still runs, so
    the context shifts the logprobs a little; greedy replies are exactly REPLY + <|im_end|>.
    """
    path = tmp_path_factory.getbasetemp() / "taught-model"
    if (path / "model.safetensors").is_file():
        return path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tiny_model_dir(tmp_path_factory)
    tok = AutoTokenizer.from_pretrained(base, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    chain = tok("\n" + TAUGHT_REPLY + EOT, add_special_tokens=False)["input_ids"]
    assert len(set(chain[:-1])) == len(chain) - 1, "each token of the chain needs one successor"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1e-2)
            layer.mlp.down_proj.weight.mul_(1e-2)
        emb = model.model.embed_tokens.weight
        states = model.model.norm(emb[chain[:-1]])  # (K, H): the last hidden state after each chain token
        target = torch.zeros(len(chain) - 1, emb.shape[0])
        target[torch.arange(len(chain) - 1), torch.tensor(chain[1:])] = 12.0
        head = (torch.linalg.pinv(states) @ target).T.contiguous()  # (V, H), exact on the chain's states
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def cfg(**kw) -> CollectConfig:
    kw.setdefault("progress", False)
    return CollectConfig(**kw)


def episodes_of(lake: Lake, run_id: str):
    return lake.query("SELECT * FROM episodes WHERE run_id = ? ORDER BY task_id, sample_index", [run_id])


def turns_of(lake: Lake, run_id: str):
    return lake.query(
        "SELECT t.* FROM turns t JOIN episodes e USING (episode_id) WHERE e.run_id = ? "
        "ORDER BY e.task_id, e.sample_index, t.turn",
        [run_id],
    )


def turns_by_episode(lake: Lake, run_id: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in turns_of(lake, run_id).iter_rows(named=True):
        out.setdefault(row["episode_id"], []).append(row)
    return out


def assert_episodes_whole(lake: Lake, run_id: str, snapshot: int | None = None) -> None:
    """Every stored episode has exactly turns 0..num_turns-1, and no turn lacks its episode."""
    rows = lake.query(
        "SELECT e.episode_id, e.num_turns, count(t.turn) AS n, count(DISTINCT t.turn) AS d, "
        "coalesce(min(t.turn), 0) AS lo, coalesce(max(t.turn), -1) AS hi "
        "FROM episodes e LEFT JOIN turns t USING (episode_id) WHERE e.run_id = ? GROUP BY ALL",
        [run_id], snapshot=snapshot,
    )
    for r in rows.iter_rows(named=True):
        assert r["n"] == r["d"] == r["num_turns"] == r["hi"] + 1, r
        assert r["lo"] == 0 or r["num_turns"] == 0, r
    orphans = lake.query("SELECT count(*) AS n FROM turns WHERE episode_id NOT IN (SELECT episode_id FROM episodes)",
                         snapshot=snapshot)
    assert orphans["n"][0] == 0


def exactness(lake: Lake, run_id: str, model, tokenizer, temperature: float) -> dict[str, int]:
    """(a) ids decode to the chat template's rendering, (b) logprobs are the model's own, (c) the loss mask."""
    renderer = ChatRenderer(tokenizer)
    system = json.loads(lake.query("SELECT config FROM runs WHERE run_id = ?", [run_id])["config"][0])["system_prompt"]
    eps = episodes_of(lake, run_id)
    by_ep = turns_by_episode(lake, run_id)
    endings = Counter()
    for ep in eps.iter_rows(named=True):
        ts = by_ep[ep["episode_id"]]
        ids, mask = full_sequence(ts)

        # (a) the concatenated ids are the template's rendering of system + observations + replies
        messages = [{"role": "system", "content": system}]
        for t in ts:
            messages += [{"role": "user", "content": t["observation"]},
                         {"role": "assistant", "content": t["action_text"]}]
        rendered, decoded = renderer.render(messages), renderer.decode(ids)
        assert rendered.startswith(decoded)
        rest = rendered[len(decoded):]
        assert rest in ("\n", EOT + "\n"), rest  # the template's text after the last reply's sampled ids
        for i, t in enumerate(ts):
            prompt = renderer.decode(t["prompt_token_ids"])
            assert prompt.endswith("<|im_start|>user\n" + t["observation"] + EOT + "\n<|im_start|>assistant\n")
            if i == 0:
                assert prompt.startswith("<|im_start|>system\n" + system + EOT)
            else:  # what the template wrote after the previous reply's sampled ids starts this prompt
                closed = ts[i - 1]["response_token_ids"][-1] == tokenizer.convert_tokens_to_ids(EOT)
                assert prompt.startswith("\n<|im_start|>user\n" if closed else EOT + "\n<|im_start|>user\n")
        endings["eot" if ts[-1]["response_token_ids"][-1] == tokenizer.convert_tokens_to_ids(EOT) else "cut"] += 1

        # (c) the loss mask is 1 exactly on the response ids, in order
        assert len(mask) == len(ids) and sum(mask) == ep["num_agent_tokens"]
        pos = 0
        for t in ts:
            p, r = t["prompt_token_ids"], t["response_token_ids"]
            assert mask[pos:pos + len(p)] == [0] * len(p) and ids[pos:pos + len(p)] == list(p)
            pos += len(p)
            assert mask[pos:pos + len(r)] == [1] * len(r) and ids[pos:pos + len(r)] == list(r)
            pos += len(r)
        assert pos == len(ids)

        # (b) the stored behaviour logprobs are the model's on exactly this sequence
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        if temperature > 0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        where = [i for i, m in enumerate(mask) if m]
        recomputed = logp[torch.tensor(where) - 1, torch.tensor([ids[i] for i in where])]
        stored = torch.tensor([x for t in ts for x in t["response_logprobs"]])
        assert stored.shape == recomputed.shape
        assert torch.allclose(stored, recomputed, atol=1e-4, rtol=0), (stored - recomputed).abs().max()
    return dict(endings)


def varied_spec(folder: Path) -> str:
    """A reward spec that differs between the samples of a task whatever the model does (sample_index % 2),
    so GRPO groups always have a non-zero advantage."""
    p = Path(folder) / "varied.toml"
    p.write_text(VARIED_SPEC)
    return str(p)


def expert_lake(path: Path, model: Path) -> Lake:
    """A lake at `path` holding 4 scripted-expert doors episodes (run `expert`): SFT data for train tests."""
    lake = Lake.open(str(path))
    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=4, difficulty=1,
                          template="action", system_prompt=SYSTEM, run_id="expert", progress=False), lake)
    return lake


def small_cfg(model: str | Path, **kw) -> TrainConfig:
    """A config for fast one-process steps on the tiny model."""
    # no KL anchor unless a test asks for one (a reference model per engine would double each test's setup), and
    # every group kept: the untrained tiny model rarely wins, and these tests train on varied shaped rewards
    base = dict(model=str(model), algo="grpo", lr=1e-2, kl_coef=0.0, group_filter="all", minibatch_size=8,
                micro_batch=4, progress=False,
                save_optimizer=False, grad_clip=0.0, checkpoint_dir="ckpt", template="action",
                system_prompt=SYSTEM, max_new_tokens=12, max_turns=1, difficulty=1)
    base.update(kw)
    # the RL defaults above only where the algo has their sections (an SFT run holds no kl or algorithm section)
    from trajlake.train.algos.algorithms import ALGOS
    from trajlake.train.config import LEAVES

    uses = ALGOS[base["algo"]].sections if base["algo"] in ALGOS else tuple({key for key, _ in LEAVES.values()})
    return config_from_dict({k: v for k, v in base.items() if k in kw or LEAVES[k][0] in uses})


def synthetic(n: int, *, group_size: int = 2, seed: int = 0, scores=None, vocab: int = 500) -> list[EpisodeSeq]:
    """`n` short fake episodes (a prompt, a reply, a second prompt, a second reply), groups of `group_size`,
    with their score as a reward on the last response token."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p1, r1, p2, r2 = (rng.randrange(3, 9) for _ in range(4))
        segs = [(p1, 0), (r1, 1), (p2, 0), (r2, 1)]
        ids, mask = [], []
        for length, m in segs:
            ids += [rng.randrange(3, vocab) for _ in range(length)]
            mask += [m] * length
        score = float(scores[i]) if scores is not None else float(rng.random())
        rewards = [0.0] * len(ids)
        rewards[max(k for k, m in enumerate(mask) if m)] = score
        beh = [rng.uniform(-5, -0.1) if m else float("nan") for m in mask]
        out.append(EpisodeSeq(f"ep{i:03d}", f"g{i // group_size}", score > 0.5, ids, mask, beh, rewards, score))
    return out


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).clone() for p in module.parameters()])


#: the demo lake's scripted expert and its train run
EXPERT = "scripted:doors"
TRAIN_RUN = "train-demo"


# ---- the demo lake of the cookbook and report tests (built once per session, on disk) -----------------
def _build(path: Path, tiny: Path) -> None:
    lake = Lake.open(str(path))
    hf = HFPolicy(tiny)
    tiny_id = hf.policy_id

    def play(run_id: str, policy=None, **kw) -> None:
        kw = {"env": "doors", "policy": EXPERT, "tokenizer": str(tiny), "progress": False, **kw}
        if policy is not None:
            kw.update(policy=f"hf:{tiny}", max_turns=kw.get("max_turns", 3), max_new_tokens=8)
        collect(CollectConfig(run_id=run_id, **kw), lake, policy=policy)

    try:
        play("collect-expert", tasks=4)
        play("collect-tiny", hf, tasks=2, max_turns=3)
        play("eval-expert", split="test", tasks=3, temperature=0.0)
        play(f"{TRAIN_RUN}/eval-2", hf, split="test", tasks=2, max_turns=2, temperature=0.0)
    finally:
        hf.close()
    for run_id, parent in [("eval-expert", None), (f"{TRAIN_RUN}/eval-2", TRAIN_RUN)]:
        lake.update("runs", {"run_id": run_id}, {"kind": "eval", "parent_run_id": parent}, stage="eval")
    score(lake, default_spec())
    score(lake, load_spec(SPECS_DIR / "goal-and-turns.toml"))

    # the lineage: tiny model > sft-demo/step-2 (SFT on the expert's episodes) > train-demo/step-1 > step-2
    ids = lambda run: lake.query("SELECT episode_id FROM episodes WHERE run_id = ? ORDER BY 1",  # noqa: E731
                                 [run])["episode_id"].to_list()
    expert, tiny_eps = ids("collect-expert"), ids("collect-tiny")
    spec = default_spec().spec_id
    policies = [Policy("sft-demo/step-2", run_id="sft-demo", step=2, parent_policy_id=tiny_id)]
    policies += [Policy(f"{TRAIN_RUN}/step-{s}", run_id=TRAIN_RUN, step=s,
                        parent_policy_id="sft-demo/step-2" if s == 1 else f"{TRAIN_RUN}/step-{s - 1}") for s in (1, 2)]
    steps = [TrainStep(TRAIN_RUN, s, f"{TRAIN_RUN}/step-{s}" if s < 3 else None, 1,
                       {"iteration": s, "episodes": 4, "reward_mean": 0.1 * s, "reward_std": 0.1,
                        "success_mean": 0.25 * s, "kl": 0.01 * s, "entropy": 2.0 - 0.1 * s, "pg_clipfrac": 0.05,
                        "grad_norm": 1.0, **({"eval_success": 0.5, "eval_env_reward": 0.5} if s == 2 else {})},
                       spec, tuple(tiny_eps[:1] if s == 1 else tiny_eps))
             for s in (1, 2, 3)]
    steps += [TrainStep("sft-demo", s, "sft-demo/step-2" if s == 2 else None, 1,
                        {"step": s, "episodes": 4, "loss": 1.0 / s, "nll": 1.0 / s}, None, tuple(expert[:2 * s]))
              for s in (1, 2)]
    lake.append({"runs": [Run(TRAIN_RUN, "train", status="finished"), Run("sft-demo", "train", status="finished")],
                 "policies": policies, "train_steps": steps}, stage="train", run_id=TRAIN_RUN)
    lake.close()


def demo_lake_uri(tmp_path_factory) -> str:
    """The demo lake's URI; built on the first call of the session (a few seconds)."""
    path = tmp_path_factory.getbasetemp() / "cookbook-lake"
    done = path / ".built"
    if not done.is_file():
        shutil.rmtree(path, ignore_errors=True)
        tiny = tiny_model_dir(tmp_path_factory)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the tiny model is overhead-bound: one thread is faster on a busy machine
        try:
            _build(path, tiny)
        finally:
            torch.set_num_threads(threads)
        done.touch()
    return str(path)


#: how close a vLLM engine's stored log-probs are to the trainer's recomputation (nats): vLLM's CPU kernels sum
#: in another order than transformers'
VLLM_TOLERANCE = 1e-3


def recomputed(model_dir, lake: Lake, run_id: str, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored, recomputed) log-probs of every reply token of a run: the trainer's forward on the same ids."""
    from trajlake.lm.load import load_model

    model = load_model(model_dir)
    stored, again = [], []
    for ts in turns_by_episode(lake, run_id).values():
        ids, mask = full_sequence(ts)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
        logp = torch.log_softmax(logits, -1)
        where = [i for i, m in enumerate(mask) if m]
        again.append(logp[torch.tensor(where) - 1, torch.tensor([ids[i] for i in where])])
        stored.append(torch.tensor([x for t in ts for x in t["response_logprobs"]]))
    return torch.cat(stored), torch.cat(again)
