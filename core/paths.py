"""Where the package's own files and the data beside a checkout are: one place, so no module counts `parents`.

The recipes and the AgentGym launcher read OpenManus-RL's data and AgentGym's server from a `shared` folder:
$TRAJLAKE_SHARED when set, else the checkout's sibling `../shared` (this project's development layout).
"""

from __future__ import annotations

import os
from pathlib import Path

#: the `trajlake` package's folder (the repository root in a checkout)
PACKAGE_DIR = Path(__file__).resolve().parents[1]
SHARED_ENV = "TRAJLAKE_SHARED"


def shared_dir() -> Path:
    """The folder holding `data/agentgym` and `agentgym/`: $TRAJLAKE_SHARED, else `../shared` beside the package."""
    return Path(os.environ.get(SHARED_ENV) or PACKAGE_DIR.parent / "shared")


__all__ = ["PACKAGE_DIR", "SHARED_ENV", "shared_dir"]
