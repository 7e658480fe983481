"""What every `trajlake` command shares: the global options' state and how a command opens the lake."""

from __future__ import annotations

from typing import Optional

from trajlake.store import Lake


class State:
    lake_uri: Optional[str] = None
    debug: bool = False


def open_lake(*, read_only: bool = False) -> Lake:
    """The --lake lake; read commands open it read-only (they never create or change a lake)."""
    return Lake.open(State.lake_uri, read_only=read_only)
