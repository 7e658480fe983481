"""`python -m trajlake.train --config PATH [--algo sft] [--lake URI]`: what `trajlake train` runs, in a form
every launcher can start on each process (`deepspeed --module trajlake.train ...`, `torchrun -m ...`)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trajlake.train", description=__doc__)
    p.add_argument("--config", required=True, help="train config TOML")
    p.add_argument("--algo", choices=("grpo", "ppo", "sft"), help="override the config's algo")
    p.add_argument("--lake", default=None, help="lake URI (default: $TRAJLAKE_LAKE or ./lake)")
    p.add_argument("--run-id", default=None, help="override the config's run_id (the same id resumes)")
    p.add_argument("--model", default=None, help="override the starting model: DIR, policy:ID or run:ID")
    p.add_argument("--iterations", type=int, default=None, help="override the config's iterations")
    p.add_argument("--env-url", default=None, help="override the AgentGym server URL of the env")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = p.parse_args(argv)
    from trajlake.core.errors import TrajlakeError
    from trajlake.train.config import load_config
    from trajlake.train.loop import run

    try:
        cfg = load_config(args.config, algo=args.algo, run_id=args.run_id, model=args.model,
                          iterations=args.iterations, env_url=args.env_url)
        result = run(cfg, args.lake)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from trajlake.train.distributed import is_main

    if is_main():
        print(f"run {result.run_id}: step {result.step}, policy {result.policy_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
