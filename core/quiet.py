"""Third-party chatter a user has no use for, silenced where it is made; `--debug` lets all of it through.

Each message silenced is named here and dropped at the call that makes it, never by a blanket rule: a library's
errors, and every warning or line not named here, still reach the screen.

- DeepSpeed prints `DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully` (a bare `print`
  to stdout, in the middle of the command's results) when its process group starts: `train/distributed.py`
  starts it inside `dropping_lines(DEEPSPEED_BUILT)`.
- transformers (>= 5.2x) warns on every forward pass given `past_key_values=` (a FutureWarning) and logs
  `past_key_values/cache_params are deprecated` whenever an output's `past_key_values` is read: not
  filtered but avoided, by passing and reading the cache under the name the installed version takes
  (`lm/prefix.py`'s `cache_kwargs` and `returned_cache`).

Debug mode is `--debug` on `trajlake` and on the recipes (`set_debug`), or TRAJLAKE_DEBUG=1 in the environment
(which reaches the processes a launcher starts).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator

#: DeepSpeed's line when it has (JIT-)built or loaded one of its ops, printed to stdout
DEEPSPEED_BUILT = re.compile(r"DeepSpeed \S+ built successfully")

_debug = False


def set_debug(on: bool) -> None:
    """Let (or stop letting) the third-party output this module silences through."""
    global _debug
    _debug = bool(on)


def debug() -> bool:
    """Whether the known third-party output is shown: `--debug`, or TRAJLAKE_DEBUG=1 in the environment."""
    return _debug or os.environ.get("TRAJLAKE_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def dropping_lines(*known: re.Pattern) -> Iterator[None]:
    """Within the block, Python's stdout less the lines that match one of the `known` patterns: every other
    line is written to the real stdout when the block ends (or fails), in order. In debug mode nothing is
    held back. (Only writes through `sys.stdout`: a subprocess's output, e.g. a compiler's, is not touched.)"""
    if debug():
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            yield
    finally:
        kept = [line for line in held.getvalue().splitlines(keepends=True)
                if not any(p.search(line) for p in known)]
        if kept:
            sys.stdout.write("".join(kept))
            sys.stdout.flush()


__all__ = ["DEEPSPEED_BUILT", "debug", "dropping_lines", "set_debug"]
