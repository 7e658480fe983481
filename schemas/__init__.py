"""Record types and Arrow schemas shared by every stage."""

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
