"""Load DuckDB extensions from the files their PyPI packages ship, never from the network, once per process.

Loading an extension into a new DuckDB instance checks its signature: about 0.12 s for DuckLake's 36 MB file, and
as much again for a catalog's scanner (SQLite, PostgreSQL), more than the rest of opening a lake. So a lake's
connection (`acquire`) is a connection on an instance that already has them, when this process closed a lake
before (`release`): the lake is detached from it and the instance kept idle, with nothing attached.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import duckdb

from trajlake.core.errors import TrajlakeError

#: extension name -> the PyPI package (import name) that ships its binary
EXTENSION_PACKAGES = {
    "ducklake": "duckdb_extension_ducklake",
    "sqlite_scanner": "duckdb_extension_sqlite_scanner",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
    "httpfs": "duckdb_extension_httpfs",
}
#: extensions that are optional, -> the trajlake extra that installs them
OPTIONAL = {"httpfs": "s3"}
#: what an optional extension is for, in its missing-package error
PURPOSE = {"httpfs": "object storage (s3://, gs://, r2://, https://)"}


def extension_path(name: str) -> Path:
    """Path of the `.duckdb_extension` file for `name` matching the running duckdb version."""
    package = EXTENSION_PACKAGES[name]
    pip_name = package.replace("_", "-")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        if name in OPTIONAL:
            raise TrajlakeError(
                f"{PURPOSE[name]} needs DuckDB's {name} extension, which is not installed: "
                f"pip install 'trajlake[{OPTIONAL[name]}]' (or pip install {pip_name}=={duckdb.__version__})"
            )
        raise TrajlakeError(f"DuckDB extension {name!r} needs the package {pip_name}: pip install {pip_name}")
    root = Path(next(iter(spec.submodule_search_locations)))
    wanted = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(p.parent.name for p in root.glob(f"extensions/*/{name}.duckdb_extension"))
    raise TrajlakeError(
        f"{pip_name} ships the {name} extension for duckdb {', '.join(found) or 'no version'}, "
        f"but duckdb {duckdb.__version__} is installed: install matching versions"
    )


def connect(names: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB instance that never downloads an extension, with `names` (default: all of ours
    but the optional ones) loaded; each takes about 0.12 s to load."""
    wanted = [n for n in EXTENSION_PACKAGES if n not in OPTIONAL] if names is None else list(names)
    paths = [extension_path(name) for name in wanted]  # a missing package fails before connecting
    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    try:
        for path in paths:
            con.load_extension(str(path))
    except BaseException:
        con.close()
        raise
    return con


#: how many idle instances are kept per set of extensions (lakes open at once beyond that each load their own)
MAX_IDLE = 2
#: the databases every instance has, which a lake's release leaves attached
_BUILT_IN_DATABASES = frozenset({"memory", "system", "temp"})
_idle: dict[tuple[str, ...], list[duckdb.DuckDBPyConnection]] = {}
_in_use: dict[int, tuple[tuple[str, ...], duckdb.DuckDBPyConnection]] = {}
_pool_lock = threading.Lock()
_pool_pid = os.getpid()


def acquire(names: Iterable[str]) -> duckdb.DuckDBPyConnection:
    """A connection for one lake, on an instance with `names` loaded: an idle one this process kept (`release`),
    else a new one (`connect`). Closing the connection closes the cursors made from it; `release` it."""
    key = tuple(names)
    with _pool_lock:
        _forget_after_fork()
        idle = _idle.get(key)
        instance = idle.pop() if idle else None
    if instance is None:
        instance = connect(key)
    con = instance.cursor()
    with _pool_lock:
        _in_use[id(con)] = (key, instance)
    return con


def release(con: duckdb.DuckDBPyConnection, *, reuse: bool) -> None:
    """Close a connection from `acquire` (and with it every cursor made from it). Its instance is kept for the
    next `acquire` of this process when `reuse` (nothing was configured on it beyond attaching: no object-storage
    secret, no extension loaded later) and the lake detaches from it cleanly; otherwise it is closed too."""
    with _pool_lock:
        _forget_after_fork()  # a lake the parent opened, closed in a forked child: its instance is set aside
        key, instance = _in_use.pop(id(con), ((), None))
    con.close()
    if instance is None:
        return
    if not (reuse and _detached(instance)):
        instance.close()
        return
    with _pool_lock:
        if os.getpid() == _pool_pid and len(_idle.setdefault(key, [])) < MAX_IDLE:
            _idle[key].append(instance)
            return
    instance.close()


def _detached(instance: duckdb.DuckDBPyConnection) -> bool:
    """Detach every database but the built-in ones; whether the instance is then as `connect` made it."""
    try:
        attached = [r[0] for r in instance.execute("SELECT database_name FROM duckdb_databases()").fetchall()
                    if r[0] not in _BUILT_IN_DATABASES]
        for name in attached:
            instance.execute(f'DETACH DATABASE "{name.replace(chr(34), chr(34) * 2)}"')  # quoted as an identifier
        return not instance.execute("SELECT count(*) FROM duckdb_secrets()").fetchone()[0]
    except duckdb.Error:
        return False


#: a forked child's inherited instances, set aside unused and never closed: closing one would join the parent's
#: DuckDB threads, which the child does not have (a multiprocessing child ends with os._exit, closing nothing)
_inherited: list[duckdb.DuckDBPyConnection] = []


def _forget_after_fork() -> None:
    """In a forked child the parent's idle instances are not this process's to use (DuckDB does not survive a
    fork): they are set aside, unused."""
    global _pool_pid
    if os.getpid() != _pool_pid:
        _inherited.extend(instance for idle in _idle.values() for instance in idle)
        _inherited.extend(instance for _, instance in _in_use.values())
        _idle.clear()
        _in_use.clear()
        _pool_pid = os.getpid()
