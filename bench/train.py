"""Train throughput: trained tokens/s of one GRPO iteration, trajlake's loop vs TRL's GRPOTrainer.

    python bench/train.py [--prompts 16] [--samples 4] [--max-new-tokens 48] [--micro-batch 4] \\
        [--repeats 3] [--rounds 1] [--threads 1] [--model DIR]

The defaults are trajlake's TrainConfig defaults (16 tasks x 4 samples, 48 new tokens, micro-batch 4).

Both sides train the same model (the untrained tiny model, built offline, unless --model) on the same
prompts (the first `--prompts` tasks of the `doors` env at difficulty 1, a single-turn task, rendered by
the tokenizer's chat template with trajlake's system prompt; the sides' prompt ids are checked equal),
with the same group size, sampling settings (temperature, top_p 1, no top-k), max_new_tokens, reward
(the env's goal reward: the same env step on the parsed action), GRPO advantages (group mean and std),
PPO-clip loss 0.2 averaged over the mini-batch's tokens (TRL's `dapo`), no KL (beta 0, no reference
model), fp32, AdamW (same lr, betas, eps, no weight decay, constant lr), gradient clip 1.0, micro-batch,
one epoch and one optimizer step per iteration over all prompts x samples sequences. TRL's settings that
differ from its defaults: no gradient checkpointing (trajlake does not recompute activations), fp32, beta 0,
logging every step (trajlake stores a metrics row every iteration). See bench/README.md.

An iteration is: sample `--samples` replies to each prompt, score them, advantages, the policy update.

* trajlake: `trajlake.train.loop.train` (the real loop) with a TrainConfig, into a throwaway lake: collect
  (rollout with the in-memory actor, episodes and turns written to the store), reward scoring in the
  store, the batch read back at a pinned snapshot, advantages, the update on the DeepSpeed engine, the
  checkpoint (a policy folder) and the train_steps commit.
* TRL: `GRPOTrainer.train()`: generation with `model.generate`, the reward function, advantages, the
  micro-batches' loss and backward, the optimizer step.

Each side runs in its own process, `--threads` torch threads each, one after the other (alternating between
rounds): 1 untimed warm-up iteration, then `--repeats` timed ones. trajlake's iteration time is wall clock
between the ends of consecutive train_steps commits (checkpoint included; `loop s` leaves out the checkpoint
and commit); TRL's between consecutive `on_step_end` callbacks. Trained tokens are counted the same way on
both sides (completion tokens under the loss mask). The untrained tiny model's rewards are all equal, so every
advantage is 0: trajlake's `drop_zero_advantage` is turned off, and both sides do the full update.

`--json PATH` writes the headline row (bench/headline.py) for `make bench`; `--quick` is the suite's size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from headline import Headline, add_json_option, write_rows
from mfu import FLOPS_PER_PARAM_TOKEN, count_params, matmul_peak, mfu

GOAL_SPEC = """
name = "bench-goal"
[allocation]
strategy = "last_token"
[[components]]
kind = "goal"
weight = 1.0
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="prompts (tasks) per iteration")
    p.add_argument("--samples", type=int, default=4, help="samples per prompt: the GRPO group size")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward pass")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--env", default="doors", help="a built-in env whose tasks at --difficulty take one turn")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--template", default="action", help="action template of the replies (collect.templates)")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations per side (after 1 warm-up)")
    p.add_argument("--rounds", type=int, default=1, help="run the pair of sides this many times, alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of each side")
    p.add_argument("--model", default=None, help="model folder (default: build the tiny model in the temp dir)")
    p.add_argument("--only", choices=("trajlake", "trl"), default=None, help="run one side only")
    p.add_argument("--quick", action="store_true", help="2 rounds of 2 timed iterations (make bench's size)")
    add_json_option(p)
    p.add_argument("--side", choices=("trajlake", "trl"), default=None, help=argparse.SUPPRESS)  # worker mode
    p.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats = 2, 2
    if args.samples < 2:
        p.error("--samples must be >= 2 (GRPO compares the samples of a prompt)")
    if (args.prompts * args.samples) % args.micro_batch:
        p.error("--prompts * --samples must be a multiple of --micro-batch (one optimizer step per iteration)")
    return args


def trl_missing() -> str | None:
    """Why TRL's side cannot run (None: it can)."""
    try:
        import trl  # noqa: F401
    except ImportError as e:
        return (f"TRL is not installed ({e}); install the bench extra: .venv/bin/pip install -e '.[bench]' "
                "(or run --only trajlake)")
    return None


# ---- what both sides share -----------------------------------------------------------------------------
def setup_env(args):
    """The env, the action template, the tasks and the system prompt of the run."""
    from trajlake.collect.envs import make_env
    from trajlake.collect.rollout import system_prompt
    from trajlake.collect.templates import get_template

    env = make_env(args.env)
    template = get_template(args.template)
    tasks = env.tasks("train", n=args.prompts, difficulty=args.difficulty)
    return env, template, tasks, system_prompt(env, template)


def prompt_messages(env, tasks, system: str) -> list[list[dict]]:
    return [[{"role": "system", "content": system}, {"role": "user", "content": env.reset(t)}] for t in tasks]


def goal_reward(env, template, task, text: str) -> float:
    """What trajlake's rollout and its `goal` reward component give a one-turn episode replying `text`:
    the parsed action (the raw reply when it has none) goes to the env; success 1, a finished failure -1,
    otherwise (the turn cap reached) the env's score, else its reward."""
    action = template.parse(text)
    env.reset(task)
    _, reward, done, info = env.step(action if action is not None else text)
    if info.get("success"):
        return 1.0
    if done:
        return -1.0
    score = info.get("score")
    return float(score) if score is not None else float(reward)


def _threads(n: int) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


# ---- trajlake's side ----------------------------------------------------------------------------------
def run_trajlake(args, model_dir: str, work: Path) -> dict:
    import torch

    _threads(args.threads)
    import trajlake.train.train_run as train_run
    from trajlake.store import Lake
    from trajlake.train.config import config_from_dict
    from trajlake.train.loop import train

    env, template, tasks, system = setup_env(args)
    spec = work / "goal.toml"
    spec.write_text(GOAL_SPEC)
    n = args.prompts * args.samples
    cfg = config_from_dict(dict(
        model=model_dir, algo="grpo", run_id="bench-train", checkpoint_dir=str(work / "ckpt"), seed=args.seed,
        env=args.env, split="train", difficulty=args.difficulty, tasks=args.prompts, samples=args.samples,
        iterations=1 + args.repeats, max_turns=1, template=args.template, temperature=args.temperature,
        top_p=1.0, max_new_tokens=args.max_new_tokens, system_prompt=system, concurrency=n,
        reward_spec=str(spec), advantage="grpo", policy_loss="ppo_clip", agg_mode="token-mean", clip_low=0.2,
        clip_high=0.2, norm_adv_by_std=True, drop_zero_advantage=False, entropy_coef=0.0, kl_coef=0.0,
        lr=args.lr, weight_decay=0.0, epochs=1, minibatch_size=n, micro_batch=args.micro_batch, grad_clip=1.0,
        dtype="fp32", progress=False,
    ))
    ends: list[float] = []
    commit = train_run.commit_step  # the train_steps commit, as the run calls it

    def timed_commit(*a, **kw):  # the loop's last store write of an iteration
        try:
            return commit(*a, **kw)
        finally:
            ends.append(time.perf_counter())

    train_run.commit_step = timed_commit
    lake = Lake.open(str(work / "lake"))
    try:
        t0 = time.perf_counter()
        result = train(cfg, lake)
        total = time.perf_counter() - t0
        prompt_ids = lake.query(
            "SELECT e.task_id, t.prompt_token_ids FROM episodes e JOIN turns t USING (episode_id) "
            "WHERE e.run_id = 'bench-train/it-1' AND t.turn = 0 AND e.sample_index = 0 ORDER BY e.task_id"
        ).to_dicts()
    finally:
        train_run.commit_step = commit
        lake.close()
    by_task = {r["task_id"]: list(r["prompt_token_ids"]) for r in prompt_ids}
    its = []
    for k, m in enumerate(result.history):
        its.append({"tokens": int(m["agent_tokens"]), "episodes": int(m["episodes"]),
                    "seconds": ends[k] - (ends[k - 1] if k else t0), "loop_seconds": m["collect_s"] + m["update_s"],
                    "collect_s": m["collect_s"], "update_s": m["update_s"], "reward_mean": m["reward_mean"]})
    return {"side": "trajlake", "iterations": its, "total_seconds": total, "threads": torch.get_num_threads(),
            "prompt_ids": [by_task[t.task_id] for t in tasks]}


# ---- TRL's side ---------------------------------------------------------------------------------------
def run_trl(args, model_dir: str, work: Path) -> dict:
    import torch

    _threads(args.threads)
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trajlake.lm.load import load_model, load_tokenizer

    datasets.disable_progress_bars()
    env, template, tasks, system = setup_env(args)
    by_id = {t.task_id: t for t in tasks}
    msgs = prompt_messages(env, tasks, system)
    data = datasets.Dataset.from_list([{"prompt": m, "task_id": t.task_id} for m, t in zip(msgs, tasks, strict=True)])
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    n = args.prompts * args.samples
    tokens: list[int] = []
    rewards: list[float] = []

    def env_goal(prompts, completions, completion_ids, task_id, **kw):
        out = [goal_reward(env, template, by_id[tid], c[-1]["content"] if isinstance(c, list) else c)
               for c, tid in zip(completions, task_id, strict=True)]
        tokens.append(sum(len(ids) for ids in completion_ids))  # the completion mask: up to the first eos
        rewards.append(sum(out) / len(out))
        return out

    ends: list[float] = []
    generating: list[float] = []  # per step: the batch's generation, rewards and advantages

    class Timer(TrainerCallback):
        def on_step_end(self, *a, **kw):
            ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(work / "trl"), seed=args.seed, use_cpu=True, bf16=False, fp16=False, report_to="none",
        save_strategy="no", disable_tqdm=True, logging_steps=1, max_steps=1 + args.repeats,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=n // args.micro_batch,
        num_generations=args.samples, max_completion_length=args.max_new_tokens, temperature=args.temperature,
        top_p=1.0, top_k=0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        learning_rate=args.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        optim="adamw_torch_fused", lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        shuffle_dataset=False, dataloader_num_workers=0, log_completions=False, gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[env_goal], args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Timer()])
    _threads(args.threads)  # accelerate sets its own count when it finds a process group
    generate = trainer._generate_and_score_completions  # once per step: the step's whole batch

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            generating.append(time.perf_counter() - t)

    trainer._generate_and_score_completions = timed_generate
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    if not len(tokens) == len(generating) == len(ends):
        raise RuntimeError(f"TRL generated {len(generating)} and scored {len(tokens)} batches in {len(ends)} steps: "
                           "expected one each")
    its = []
    for k in range(len(ends)):
        seconds = ends[k] - (ends[k - 1] if k else t0)
        its.append({"tokens": tokens[k], "episodes": n, "seconds": seconds, "reward_mean": rewards[k],
                    "update_s": seconds - generating[k]})
    prompt_ids = [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]) for m in msgs]
    return {"side": "trl", "iterations": its, "total_seconds": total, "threads": torch.get_num_threads(),
            "prompt_ids": prompt_ids}


# ---- the driver ---------------------------------------------------------------------------------------
def worker(args) -> int:
    work = Path(args.workdir)
    run = run_trajlake if args.side == "trajlake" else run_trl
    result = run(args, args.model, work)
    (work / f"{args.side}.json").write_text(json.dumps(result))
    return 0


def run_side(side: str, args, model_dir: str, tmp: Path, k: int) -> dict:
    work = tmp / f"{side}-{k}"
    work.mkdir()
    argv = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--workdir", str(work),
            "--model", model_dir] + [a for a in _forward(args)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
           "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"the {side} side failed (exit {proc.returncode})")
    return json.loads((work / f"{side}.json").read_text())


def _forward(args) -> list[str]:
    out = []
    for name in ("prompts", "samples", "max_new_tokens", "temperature", "micro_batch", "lr", "env", "difficulty",
                 "template", "repeats", "seed", "threads"):
        out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return out


def summarize(result: dict) -> dict:
    timed = result["iterations"][1:]  # the first is the warm-up
    tokens = sum(i["tokens"] for i in timed)
    seconds = sum(i["seconds"] for i in timed)
    out = {"side": result["side"], "iterations": len(timed), "tokens": tokens, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "per_iteration": [round(i["seconds"], 4) for i in timed],
           "reward_mean": statistics.mean(i["reward_mean"] for i in timed), "threads": result["threads"]}
    if "loop_seconds" in timed[0]:
        loop = sum(i["loop_seconds"] for i in timed)
        out.update(loop_seconds=loop, loop_tokens_per_s=tokens / loop,
                   collect_s=sum(i["collect_s"] for i in timed) / len(timed))
    if "update_s" in timed[0]:  # the policy update alone: its forward and backward passes, the optimizer step
        out.update(update_s=sum(i["update_s"] for i in timed) / len(timed),
                   update_tokens_per_s=tokens / sum(i["update_s"] for i in timed))
    return out


def report(args, sides: list[str], results: list[dict], load: tuple[float, float, float],
           machine: dict | None = None) -> list[dict]:
    """Print the table of `results` (one {side: worker result} per round); returns a row per round with
    each side's summary and, with both sides, the ratio trajlake / TRL of trained tokens per second. With
    `machine` ({"params", "peak"}: the model's parameters, the measured matmul FLOP/s), each side's MFU too."""
    n = args.prompts * args.samples
    print(f"GRPO iteration throughput: env {args.env} difficulty {args.difficulty}, {args.prompts} prompts x "
          f"{args.samples} samples = {n} sequences, max_new_tokens {args.max_new_tokens}, temperature "
          f"{args.temperature}, micro-batch {args.micro_batch}, 1 optimizer step per iteration, fp32, "
          f"{args.threads} torch thread(s), model {args.model or 'tiny (untrained, built offline)'}; "
          f"1 warm-up + {args.repeats} timed iterations per side; load average {load[0]:.2f}")
    prompt_len = [len(p) for p in results[0][sides[0]]["prompt_ids"]]
    print(f"prompt tokens per prompt: {min(prompt_len)}-{max(prompt_len)}")
    if machine:
        print(f"model {machine['params'] / 1e6:.1f}M parameters; fp32 matmul peak measured here "
              f"{machine['peak'] / 1e9:.1f} GFLOP/s at {args.threads or 'the default'} thread(s); MFU = "
              f"{FLOPS_PER_PARAM_TOKEN} x parameters x (prompt + reply tokens) / s / peak")
    print(f"{'round':<6}{'side':<10}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'per iteration (s)':>28}"
          f"{'reward':>8}{'loop s':>8}{'loop tok/s':>11}")
    rows = []
    for k, rr in enumerate(results):
        summary = {s: summarize(rr[s]) for s in sides}
        for s in sides:
            r = summary[s]
            if machine:
                r["mfu"] = mfu(r, sum(prompt_len) * args.samples, machine["params"], machine["peak"])
                if "update_s" in r:
                    r["update_mfu"] = mfu(r, sum(prompt_len) * args.samples, machine["params"], machine["peak"],
                                          update=True)
            loop = f"{r['loop_seconds']:>8.2f}{r['loop_tokens_per_s']:>11.0f}" if "loop_seconds" in r else ""
            its = " ".join(f"{x:.2f}" for x in r["per_iteration"])
            share = f"  MFU {r['mfu']:.1%}" if "mfu" in r else ""
            print(f"{k + 1:<6}{s:<10}{r['tokens']:>8}{r['seconds']:>9.2f}{r['tokens_per_s']:>10.0f}{its:>28}"
                  f"{r['reward_mean']:>8.2f}{loop}{share}")
        row = {"round": k + 1, **summary}
        if len(sides) == 2:
            row["ratio"] = summary["trajlake"]["tokens_per_s"] / summary["trl"]["tokens_per_s"]
            row["ratio_loop"] = summary["trajlake"]["loop_tokens_per_s"] / summary["trl"]["tokens_per_s"]
            row["ratio_update"] = (summary["trajlake"]["update_tokens_per_s"]
                                   / summary["trl"]["update_tokens_per_s"])
            print(f"      trajlake / TRL tokens/s: {row['ratio']:.2f}x whole iteration, "
                  f"{row['ratio_loop']:.2f}x without the checkpoint (collect_s + update_s)")
            mfus = (f" (MFU {summary['trajlake']['update_mfu']:.1%} vs {summary['trl']['update_mfu']:.1%})"
                    if machine else "")
            print(f"      the update alone: {summary['trajlake']['update_s']:.2f} s vs {summary['trl']['update_s']:.2f}"
                  f" s an iteration{mfus}: {row['ratio_update']:.2f}x")
        rows.append(row)
    if len(sides) == 2 and len(rows) > 1:
        tl = sum(r["trajlake"]["tokens"] for r in rows) / sum(r["trajlake"]["seconds"] for r in rows)
        tr = sum(r["trl"]["tokens"] for r in rows) / sum(r["trl"]["seconds"] for r in rows)
        print(f"all rounds: trajlake {tl:.0f} tokens/s, TRL {tr:.0f} tokens/s, ratio {tl / tr:.2f}x")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.side:
        return worker(args)
    sides = [s for s in ("trl", "trajlake") if args.only in (None, s)]
    if "trl" in sides:
        why = trl_missing()
        if why:
            print(f"bench/train.py: {why}", file=sys.stderr)
            return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from trajlake.lm.build import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="trajlake-bench-train-") as tmp:
        tmp = Path(tmp)
        model_dir = str(Path(args.model).absolute()) if args.model else str(build_tiny_model(tmp / "tiny"))
        results = []
        for k in range(args.rounds):  # alternate which side goes first
            order = sides if k % 2 == 0 else sides[::-1]
            results.append({s: run_side(s, args, model_dir, tmp, k) for s in order})
        if len(sides) == 2 and results[0]["trl"]["prompt_ids"] != results[0]["trajlake"]["prompt_ids"]:
            print("warning: the two sides' prompt ids differ", file=sys.stderr)
        load = os.getloadavg()
        machine = {"params": count_params(model_dir), "peak": matmul_peak(args.threads)}
    rows = report(args, sides, results, load, machine)
    write_rows(args.json, headlines(args, rows, load))
    return 0


def headlines(args, rows: list[dict], load: tuple[float, float, float]) -> list[Headline]:
    """trajlake against TRL in trained tokens/s over all rounds (none with one side): target 2.5x with the
    tiny model, 1.5x with another (--model)."""
    if not rows or "ratio" not in rows[0]:
        return []
    tokens = {s: sum(r[s]["tokens"] for r in rows) / sum(r[s]["seconds"] for r in rows) for s in ("trajlake", "trl")}
    model = "tiny model" if args.model is None else Path(args.model).name
    return [Headline(
        stage=f"GRPO iteration: {model}, {args.prompts}x{args.samples}x{args.max_new_tokens}",
        trajlake="trajlake's train loop (store, checkpoint)", alternative=f"TRL {_version('trl')} GRPOTrainer",
        trajlake_value=tokens["trajlake"], alternative_value=tokens["trl"], unit="tokens/s",
        target=2.5 if args.model is None else 1.5,
        note=f"{len(rows)} rounds of {args.repeats} iterations: " + ", ".join(f"{r['ratio']:.2f}x" for r in rows)
        + f"; without the checkpoint {statistics.median(r['ratio_loop'] for r in rows):.2f}x (median)"
        + (f"; the update alone {statistics.median(r['ratio_update'] for r in rows):.2f}x (median)"
           if "ratio_update" in rows[0] else "")
        + (f"; MFU trajlake {statistics.median(r['trajlake']['mfu'] for r in rows):.1%}, TRL "
           f"{statistics.median(r['trl']['mfu'] for r in rows):.1%} of a measured fp32 matmul peak"
           if "mfu" in rows[0]["trajlake"] else ""),
        extra={"args": {k: v for k, v in vars(args).items() if k not in ("side", "workdir")}, "load": load,
               "rounds": rows})]


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
