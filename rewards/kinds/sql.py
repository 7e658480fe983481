"""The `sql` kind: any SQL expression over episodes columns."""

from __future__ import annotations

from trajlake.rewards.component_kind import ComponentKind, no_columns
from trajlake.rewards.expr_checks import check_sql

SQL = ComponentKind(
    kind="sql",
    doc="Any SQL expression `expr` over episodes columns (e.g. \"num_turns * 0.1\").",
    defaults={"expr": None},
    check=lambda p: check_sql(p["expr"], "episodes", "expr"),
    turn_columns=no_columns,
    aggregates=no_columns,
    value=lambda n, p: f"CAST(({p['expr']}\n) AS DOUBLE)",
)
