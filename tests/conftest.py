"""Shared fixtures: every lake lives in tmp_path; store tests run against every catalog backend."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest

from trajlake.store import Lake

#: fixtures of their own modules, for every test module: the local S3 server (s3_server, s3)
pytest_plugins = ["tests.s3_server"]

#: libpq conninfo of the PostgreSQL server the postgres-backend tests use.
PG_ENV = "TRAJLAKE_TEST_PG"
PG_DEFAULT = "dbname=test host=127.0.0.1 user=postgres"
BACKENDS = ["duckdb", "sqlite", "postgres"]
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


#: the catalogs whose runs of a test belong to the slow tier: `make test` runs every store test on the DuckDB-file
#: lake, `make test-slow` (CI) on all three (about 190 runs, half of the fast tier's wall time on 2 cores)
SLOW_CATALOGS = ("sqlite", "postgres")

#: the slow tier's longest files, longest first (make test-slow, 2026-11-27, 2 workers on 2 cores: the docs' blocks
#: 506 s, the fuzzers 382 s, re-score 257 s, the SQL guard 240 s, the learning test 235 s, DeepSpeed 171 s). With
#: --no-loadscope-reorder (make test-slow) xdist hands out whole files in collection order, so these start first
#: and the short ones fill in around them; by its default order, the most tests first, the docs' one 8-minute
#: test started last and ran alone at the end of a 39-minute tier.
LONG_FILES = ("test_readme.py", "test_fuzz_cli.py", "test_rescore.py", "test_sql_guard.py", "test_train_learning.py",
              "test_train_distributed.py")


def pytest_configure(config):
    """In several xdist workers, one torch/OpenMP thread per worker, for the worker and every process it starts
    (unless OMP_NUM_THREADS is set). A worker per core at a thread per core oversubscribes the cores, and
    OpenMP's spinning threads then wait on each other: two SFT runs side by side on 2 cores took 121 s each at
    2 threads and 13 s each at 1 (8 s alone at 2), which timed out the docs' tour in CI."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    """A test's runs on the SQLite and PostgreSQL catalogs are slow-tier tests. The hostile suites
    (tests/bad_inputs_common.py) run every case on the DuckDB-file lake and a sample of them (marked
    catalog_sample) on SQLite and PostgreSQL: the others are deselected there. The LONG_FILES run first."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v in SLOW_CATALOGS for v in params.values()):
            item.add_marker(pytest.mark.slow)
        on_catalog = params.get("setting") in SLOW_CATALOGS
        (drop if on_catalog and item.get_closest_marker("catalog_sample") is None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    rank = {name: i for i, name in enumerate(LONG_FILES)}  # the LONG_FILES first; a file's tests keep their order
    items[:] = sorted(keep, key=lambda item: rank.get(item.path.name, len(rank)))


def load_bench(name: str):
    """bench/<name>.py as a module (the benchmarks are scripts, not a package)."""
    folder = Path(__file__).resolve().parents[1] / "bench"
    path = folder / f"{name}.py"
    if str(folder) not in sys.path:  # as when run as a script: the benches import bench/headline.py by name
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Run each test in its own folder, so the default lake (./lake) is a fresh one in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAJLAKE_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): the tiny
    model is overhead-bound, so one thread is faster, and far faster on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The random-weight tiny model's folder, built once per session."""
    from tests.helpers import tiny_model_dir

    return tiny_model_dir(tmp_path_factory)


@pytest.fixture
def flaky_env(monkeypatch):
    """The env `test-flaky`, registered for one test: `guess`, except that a reset raises an env error (as an
    unreachable env server's does) while `down` is true, or for the task ids in `failing`. Returns the class;
    set `cls.down` / `cls.failing` to break or mend it. Its scripted expert is `scripted` (guess's)."""
    from trajlake.collect.envs import registry
    from trajlake.collect.envs.guess import GuessEnv

    class FlakyGuess(GuessEnv):
        name = "test-flaky"
        down = False
        failing: set[str] = set()

        def reset(self, task):
            if FlakyGuess.down or task.task_id in FlakyGuess.failing:
                raise ConnectionError(f"cannot connect to the env server (task {task.task_id})")
            return super().reset(task)

    monkeypatch.setattr(registry.ENVS, "_entries", dict(registry.ENVS._entries))  # gone again after the test
    registry.register_env(FlakyGuess)
    return FlakyGuess


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One lake per module for the tests that only read back their own run (queries filter by run id)."""
    lk = Lake.open(str(tmp_path_factory.mktemp("shared") / "lake"))
    yield lk
    lk.close()


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """A lake per module that the error tests must leave empty."""
    lk = Lake.open(str(tmp_path_factory.mktemp("untouched") / "lake"))
    yield lk
    assert lk.query("SELECT count(*) AS n FROM runs")["n"][0] == 0, "a refused run wrote to the lake"
    assert lk.count("episodes") == 0
    lk.close()


def pg_conninfo() -> str:
    return os.environ.get(PG_ENV, PG_DEFAULT)


def _pg_available() -> str | None:
    """None when the PostgreSQL server answers, else why not."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e .[dev])"
    try:
        with psycopg.connect(pg_conninfo(), connect_timeout=3):
            return None
    except Exception as e:  # any failure to connect means: skip, saying why
        return f"no PostgreSQL at '{pg_conninfo()}' ({str(e).strip().splitlines()[0]}); set {PG_ENV} to a conninfo"


@pytest.fixture
def pg_schema():
    """A fresh PostgreSQL schema for one test's catalog, dropped afterwards."""
    why = _pg_available()
    if why:
        pytest.skip(why)
    import psycopg

    schema = "trajlake_test_" + uuid.uuid4().hex[:12]
    yield schema
    with psycopg.connect(pg_conninfo(), autocommit=True) as con:
        con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def make_uri(backend: str, tmp_path: Path, request) -> str:
    if backend == "duckdb":
        return str(tmp_path / "lake")
    if backend == "sqlite":
        return f"sqlite:{tmp_path / 'catalog.sqlite'}"
    schema = request.getfixturevalue("pg_schema")
    return f"postgres:{pg_conninfo()} metadata_schema={schema} data_path={tmp_path / 'pgdata'}"


@pytest.fixture(params=BACKENDS)
def lake_uri(request, tmp_path) -> str:
    """The URI of an empty lake on each catalog backend in turn."""
    return make_uri(request.param, tmp_path, request)


@pytest.fixture
def lake(lake_uri):
    lk = Lake.open(lake_uri)
    yield lk
    lk.close()


def require_textcraft_server() -> None:
    """Skip, saying why, where AgentGym's TextCraft server cannot start here; in CI (CI=true) fail instead."""
    from trajlake.collect.envs.agentgym_launch import server_missing_reason

    why = server_missing_reason()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"CI must run the real TextCraft server tests: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def textcraft_url(tmp_path_factory) -> str:
    """The URL of AgentGym's real TextCraft server, started on 127.0.0.1 for a module (its log in tmp).

    Skips, saying why, where the server's source (../shared/agentgym) or its packages are missing; in CI
    (CI=true) that is a failure instead, so the real-server tests never go quietly unrun there.
    """
    from trajlake.collect.envs.agentgym_launch import textcraft_server

    require_textcraft_server()
    log = tmp_path_factory.mktemp("textcraft") / "server.log"
    with textcraft_server(log=log) as server:
        yield server.url


@pytest.fixture
def fresh_ray():
    """Ray shut down before and after the test, so that each test has a Ray of its own (a cluster it starts, or
    one started in this process), never one an earlier test left; skipped where Ray is not installed."""
    ray = pytest.importorskip("ray")
    ray.shutdown()
    yield ray
    ray.shutdown()
