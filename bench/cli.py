"""How long the command line takes to answer: `trajlake sql` against the same query through Python's duckdb with
the DuckLake extension attached (the floor a CLI in Python can reach), and `trajlake --help` against starting
Python itself, each a fresh process, alternating, the median of `--repeats`.

    python bench/cli.py [--repeats 7] [--json PATH]

The lake is made here (a few hundred episodes by the scripted doors expert, no model), in a temporary folder.
Issue 37's targets: `sql` within 2x of bare duckdb and under 1 s; `--help` under 0.5 s.

A third row opens the lake again and again in one process, as a recipe, the viewer or a test suite does: trajlake's
`Lake.open` (read-only) and the count, against the same attach and count on a new DuckDB instance each time (the
DuckLake extension loaded, and its signature checked, every time), alternating, the median of 5 x `--repeats`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from headline import Headline, add_json_option, write_rows

QUERY = "SELECT count(*) AS n FROM episodes"
#: the bare side: one interpreter, duckdb, the DuckLake extension, the catalog attached read-only, the query
BARE = """
import sys, duckdb
con = duckdb.connect()
con.execute(f"LOAD '{sys.argv[3]}'")  # the extension file of the PyPI package, as trajlake loads it
con.execute(f"ATTACH 'ducklake:{sys.argv[1]}/catalog.ducklake' AS lake (READ_ONLY, DATA_PATH '{sys.argv[1]}/data')")
con.execute("USE lake")
print(con.execute(sys.argv[2]).fetchall())
"""


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def make_lake(root: Path) -> Path:
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect
    from trajlake.lm.build import build_tiny_model
    from trajlake.store import Lake

    build_tiny_model(root / "tiny")
    with Lake.open(str(root / "lake")) as lake:
        collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(root / "tiny"), tasks=200,
                              progress=False), lake)
    return root / "lake"


def reopened(lake: Path, repeats: int) -> tuple[float, float]:
    """Median seconds of an in-process open + count: trajlake's `Lake.open` against a new instance each time."""
    from trajlake.store import Lake, extensions

    def ours() -> None:
        with Lake.open(str(lake), read_only=True) as lk:
            lk.query(QUERY)

    def new_instance() -> None:
        con = extensions.connect(("ducklake",))
        try:
            con.execute(f"ATTACH 'ducklake:{lake}/catalog.ducklake' AS lake (READ_ONLY, DATA_PATH '{lake}/data')")
            con.execute("USE lake")
            con.execute(QUERY).fetchall()
        finally:
            con.close()

    times: dict[str, list[float]] = {"ours": [], "new": []}
    ours()  # the first open of the process loads the extension on either side
    for _ in range(repeats):
        for name, side in (("ours", ours), ("new", new_instance)):
            start = time.perf_counter()
            side()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["ours"]), statistics.median(times["new"])


def measure(repeats: int) -> list[Headline]:
    from trajlake.store.extensions import extension_path

    trajlake = [sys.executable, "-m", "trajlake"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lake = make_lake(root)
        sides = {
            "sql": [*trajlake, "--lake", str(lake), "sql", QUERY],
            "bare": [sys.executable, "-c", BARE, str(lake), QUERY, str(extension_path("ducklake"))],
            "help": [*trajlake, "--help"],
            "python": [sys.executable, "-c", "pass"],
        }
        for argv in sides.values():  # warm: the files in the page cache, as for a user's second command
            timed(argv, root)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(repeats):  # alternating, so a change of load moves every side alike
            for name, argv in sides.items():
                times[name].append(timed(argv, root))
        again, new = reopened(lake, 5 * repeats)
    print(f"reopen  median {again:.3f} s  (a new instance each time: {new:.3f} s)")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:7s} median {med[name]:.3f} s  (min {min(ts):.3f}, max {max(ts):.3f}, {len(ts)} runs)")
    return [
        Headline("cli: sql, one count on a small lake", "trajlake sql (fresh process)",
                 "Python + duckdb + DuckLake attached, the same query", med["sql"], med["bare"], "s", 0.5,
                 note=f"target: within 2x of bare duckdb and under 1 s; median of {repeats}"),
        Headline("cli: --help", "trajlake --help (fresh process)", "python -c pass", med["help"], med["python"], "s",
                 0.0, note=f"target: under 0.5 s; median of {repeats}",
                 extra={"help_s": med["help"]}),
        Headline("store: a lake opened again in one process, and a count", "Lake.open (read-only) + query",
                 "a new DuckDB instance each time: DuckLake loaded, attached, the same query", again, new, "s", 1.0,
                 note=f"the extension loaded once per process; median of {5 * repeats}"),
    ]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="Runs of each side (the median is reported).")
    add_json_option(p)
    args = p.parse_args(argv)
    rows = measure(args.repeats)
    for r in rows:
        print(f"{r.stage}: {r.trajlake_value:.3f} s vs {r.alternative_value:.3f} s ({r.alternative}): "
              f"ratio {r.ratio:.2f}")
    write_rows(args.json, rows)


if __name__ == "__main__":
    main()
