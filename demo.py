"""`make demo`: the main job on the embedded lake, end to end with what exists so far.

Builds the tiny offline model, imports OpenManus-RL's own AgentGym trajectories (from ../shared when the
checkout has it beside, or any folder given with --data) into the lake with exact token ids, and prints
what the store now holds. Every number printed is read back from the store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trajlake.display import Format, console, emit
from trajlake.store import Lake, TrajlakeError

ROOT = Path(__file__).resolve().parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "agentgym"


def run(lake_uri: str, models: Path, data: Path) -> None:
    from trajlake.collect.importers.agentgym import import_agentgym
    from trajlake.collect.models import build_tiny_model, model_summary

    tiny = models / "tiny"
    if not (tiny / "model.safetensors").exists():
        console.rule("1. build the tiny model (offline)")
        build_tiny_model(tiny)
    console.print(f"model {tiny}: {model_summary(tiny)['params']:,} parameters")

    console.rule("2. import AgentGym trajectories into the lake")
    files = sorted(data.glob("*/*.parquet")) if data.is_dir() else []
    if files:
        with Lake.open(lake_uri) as lake:
            console.print(str(import_agentgym(lake, files, tiny)))
    else:
        console.print(f"no AgentGym files under {data}: skipping the import (pass --data DIR)")

    console.rule("3. what the store holds (SQL over the lake)")
    with Lake.open(lake_uri) as lake:
        emit(lake.query(
            "SELECT e.env, count(*) AS episodes, round(avg(e.num_turns), 1) AS mean_turns, "
            "sum(e.num_agent_tokens)::BIGINT AS agent_tokens, sum(t.tokens)::BIGINT AS all_tokens "
            "FROM episodes e JOIN (SELECT episode_id, sum(len(prompt_token_ids) + len(response_token_ids)) "
            "AS tokens FROM turns GROUP BY episode_id) t USING (episode_id) GROUP BY e.env ORDER BY e.env"
        ), Format.table, None)
        emit(lake.snapshots().drop("changes").tail(5), Format.table, None)
    console.print(f"lake: {lake_uri}; explore it with: .venv/bin/trajlake --lake {lake_uri} sql")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajlake.demo", description=__doc__)
    parser.add_argument("--lake", default="lake", help="lake URI (default ./lake)")
    parser.add_argument("--models", type=Path, default=Path("models"), help="where models are built")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of AgentGym parquet files")
    args = parser.parse_args(argv)
    try:
        run(args.lake, args.models, args.data)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
