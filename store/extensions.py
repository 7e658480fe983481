"""Load DuckDB extensions from the files their PyPI packages ship, never from the network."""

from __future__ import annotations

import importlib.util
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
    """An in-memory DuckDB connection that never downloads an extension, with `names` (default: all of ours
    but the optional ones) loaded; each takes about 0.2 s to load."""
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
