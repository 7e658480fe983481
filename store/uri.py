"""Catalog URIs: where a lake's catalog and data files live.

- `PATH` (a folder, the embedded default): DuckDB-file catalog `PATH/catalog.ducklake`, data `PATH/data/`.
- `sqlite:FILE`: SQLite catalog (several processes may write), data beside it in `FILE.data/`.
- `postgres:CONNINFO`: PostgreSQL catalog (several processes or machines). CONNINFO is libpq's
  `key=value` form; two extra keys are ours: `data_path=...` (default `./lake_data/`, or any path DuckDB
  can write, such as object storage) and `metadata_schema=...` (the PostgreSQL schema holding the catalog).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from trajlake.store.errors import CatalogError

DEFAULT_LAKE = "lake"
ENV_VAR = "TRAJLAKE_LAKE"


@dataclass(frozen=True)
class CatalogURI:
    """A parsed catalog URI."""

    backend: str  # "duckdb" | "sqlite" | "postgres"
    metadata: str  # what follows `ducklake:` in the ATTACH string
    data_path: str
    metadata_schema: str | None = None
    raw: str = ""

    @property
    def multi_process(self) -> bool:
        return self.backend != "duckdb"

    @property
    def extensions(self) -> tuple[str, ...]:
        """The DuckDB extensions this catalog needs."""
        scanner = {"sqlite": ("sqlite_scanner",), "postgres": ("postgres_scanner",)}.get(self.backend, ())
        return ("ducklake", *scanner)

    def attach_sql(self, alias: str) -> str:
        opts = [f"DATA_PATH {_quote(self.data_path)}"]
        if self.metadata_schema:
            opts.append(f"METADATA_SCHEMA {_quote(self.metadata_schema)}")
        if self.backend == "duckdb":
            # DuckLake inlines small inserts into a DuckDB-file catalog with DOUBLEs rounded to 16 digits
            # (0.09719760778190321 is read back as 0.0971976077819032): write every insert to parquet instead.
            opts.append("DATA_INLINING_ROW_LIMIT 0")
        return f"ATTACH {_quote('ducklake:' + self.metadata)} AS {alias} ({', '.join(opts)})"

    def prepare(self) -> None:
        """Create local folders the catalog and data need (nothing for remote paths)."""
        if self.backend in ("duckdb", "sqlite"):
            Path(self.metadata.removeprefix("sqlite:")).parent.mkdir(parents=True, exist_ok=True)
        if self.backend == "sqlite":
            _use_wal(self.metadata.removeprefix("sqlite:"))
        if "://" not in self.data_path:
            Path(self.data_path).mkdir(parents=True, exist_ok=True)


def _use_wal(path: str) -> None:
    """Put a SQLite catalog in WAL mode (persistent, so this acts once per file).

    In SQLite's default rollback-journal mode, concurrent DuckLake transactions on one catalog (threads
    of one process, or several processes) can deadlock each other in SQLite's busy handler; in WAL mode
    readers never block the writer. If another process holds the file so the mode cannot change now,
    the lake still opens, and a later open switches it.
    """
    con = sqlite3.connect(path, timeout=10)
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error:
        pass
    finally:
        con.close()


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def parse_uri(uri: str | os.PathLike | None) -> CatalogURI:
    """Parse a catalog URI; None means $TRAJLAKE_LAKE or `./lake`."""
    raw = str(uri) if uri is not None else os.environ.get(ENV_VAR) or DEFAULT_LAKE
    if not raw.strip():
        raise CatalogError("empty lake URI: give a folder, sqlite:FILE or postgres:CONNINFO")
    if raw.startswith("sqlite:"):
        path = raw[len("sqlite:"):]
        if not path:
            raise CatalogError("sqlite: URI needs a file path, e.g. sqlite:lake/catalog.sqlite")
        path = str(Path(path).expanduser().absolute())
        return CatalogURI("sqlite", f"sqlite:{path}", path + ".data/", raw=raw)
    if raw.startswith(("postgres:", "postgresql:")):
        conninfo = raw.split(":", 1)[1]
        pairs, extra = [], {}
        for token in conninfo.split():
            if "=" not in token:
                raise CatalogError(f"postgres URI part {token!r} is not key=value (libpq conninfo)")
            k, v = token.split("=", 1)
            if k in ("data_path", "metadata_schema"):
                extra[k] = v
            else:
                pairs.append(token)
        if not any(p.startswith("dbname=") for p in pairs):
            raise CatalogError("postgres URI needs dbname=..., e.g. postgres:dbname=trajlake host=127.0.0.1")
        data = extra.get("data_path") or str(Path("lake_data").absolute()) + "/"
        return CatalogURI("postgres", "postgres:" + " ".join(pairs), _dir(data), extra.get("metadata_schema"), raw)
    if ":" in raw.split("/")[0] and not Path(raw).exists():
        scheme = raw.split(":", 1)[0]
        raise CatalogError(f"unknown lake URI scheme {scheme!r}: use a folder, sqlite:FILE or postgres:CONNINFO")
    folder = Path(raw).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise CatalogError(f"lake path {folder} is a file; a DuckDB-file lake is a folder")
    return CatalogURI("duckdb", str(folder / "catalog.ducklake"), str(folder / "data") + "/", raw=raw)


def _dir(path: str) -> str:
    return path if path.endswith("/") else path + "/"
