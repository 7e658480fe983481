"""Record types and Arrow schemas shared by every stage.

Its names are loaded when first used (PEP 562): a module of this package that needs no Arrow schema
(views.py, the SQL of the store's views) imports without pyarrow."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajlake.schemas.records import (
        RECORD_TYPES,
        Episode,
        EpisodeReward,
        Policy,
        RewardSpecRow,
        Run,
        Task,
        TrainStep,
        Turn,
        TurnReward,
        from_table,
        to_table,
    )
    from trajlake.schemas.tables import TABLES, TableDef, table_def

__all__ = [
    "RECORD_TYPES", "TABLES", "TableDef", "table_def", "to_table", "from_table",
    "Task", "Run", "Policy", "Episode", "Turn", "RewardSpecRow", "EpisodeReward", "TurnReward", "TrainStep",
]
#: the module each name lives in
_HOMES = {name: "tables" if name in ("TABLES", "TableDef", "table_def") else "records" for name in __all__}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"trajlake.schemas.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'trajlake.schemas' has no attribute {name!r}")
