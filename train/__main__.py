"""`python -m trajlake.train --config PATH [--algo sft] [--lake URI]`: what `trajlake train` runs, in a form
every launcher can start on each process (`deepspeed --module trajlake.train ...`, `torchrun -m ...`). It takes
the same config overrides as `trajlake train` (train/overrides.py)."""

from __future__ import annotations

import argparse
import sys

from trajlake.train.overrides import Override, given_overrides, override_specs


def parser(options: list[Override]) -> argparse.ArgumentParser:
    """The command line: --config, --lake, and the override `options`."""
    p = argparse.ArgumentParser(prog="python -m trajlake.train", description=__doc__)
    p.add_argument("--config", required=True, help="train config TOML")
    p.add_argument("--lake", default=None, help="lake URI (default: $TRAJLAKE_LAKE or ./lake)")
    groups = {}
    for o in options:
        if o.section not in groups:
            groups[o.section] = p.add_argument_group(f"config overrides: {o.section}",
                                                     "each replaces that field of the config")
        # argparse formats help with %: a literal one (a LIKE pattern in a field's doc) is doubled
        text = o.help.replace("%", "%%")
        if o.type is bool:
            groups[o.section].add_argument(o.option, o.dotted, dest=o.field, action=argparse.BooleanOptionalAction,
                                           default=None, help=text)
        else:
            groups[o.section].add_argument(o.option, o.dotted, dest=o.field, type=o.type, default=None, help=text,
                                           action="append" if o.repeated else "store")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return p


def main(argv: list[str] | None = None) -> int:
    options = override_specs()
    args = parser(options).parse_args(argv)
    from trajlake.core.errors import TrajlakeError
    from trajlake.train.config import load_config
    from trajlake.train.loop import run

    overrides = given_overrides({o.field: getattr(args, o.field) for o in options})
    try:
        result = run(load_config(args.config, **overrides), args.lake)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from trajlake.train.distributed import is_main

    if is_main():
        print(f"run {result.run_id}: step {result.step}, policy {result.policy_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
