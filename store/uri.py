"""Catalog URIs: where a lake's catalog and data files live.

- `PATH` (a folder, the embedded default): DuckDB-file catalog `PATH/catalog.ducklake`, data `PATH/data/`.
- `sqlite:FILE`: SQLite catalog (several processes may write), data beside it in `FILE.data/`.
- `postgres:CONNINFO`: PostgreSQL catalog (several processes or machines). CONNINFO is libpq's
  `key=value` form; two extra keys are ours: `data_path=...` (default `./lake_data/`, or any path DuckDB
  can write, such as object storage) and `metadata_schema=...` (the PostgreSQL schema holding the catalog).

The folder and sqlite forms take a `data_path=...` too, after a space: `sqlite:cat.sqlite data_path=s3://b/p/`,
`lake data_path=s3://b/p/` (the catalog stays in the folder). A catalog remembers its data path: a lake made
with an object-storage data path reopens without `data_path=` (and refuses a different one).

Object storage. A `data_path` that is a URL (`s3://bucket/prefix/`, also `gs://`, `r2://`, `https://`)
keeps the parquet files there, read and written by DuckDB's httpfs extension, which the `s3` extra
installs (`pip install 'trajlake[s3]'`); the catalog stays where the URI says. For `s3://` the lake's
connection gets a temporary, in-memory DuckDB secret built from the standard variables (never stored in
the catalog, and never shown in an error): AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
AWS_REGION (else AWS_DEFAULT_REGION), and for an S3-compatible server (MinIO, Ceph, R2, ...)
AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, e.g. `http://127.0.0.1:9000` (`http://` turns TLS off; an
endpoint implies path-style URLs). With none of them set, DuckDB's own secrets apply (persistent ones made
in the duckdb CLI, the way to give `gs://` or `r2://` credentials), else anonymous access. AWS profiles and
instance roles are not read. Small appends to a sqlite or postgres catalog are inlined in the catalog until
`trajlake maintain` flushes them to parquet; maintenance deletes unused remote files as it does local ones.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from trajlake.errors import CatalogError
from trajlake.sql_text import sql_str
from trajlake.store import objectstore

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
    data_path_given: bool = False  # False: data_path is the backend's default

    @property
    def multi_process(self) -> bool:
        return self.backend != "duckdb"

    @property
    def remote(self) -> bool:
        """Whether the data files are on object storage (a URL)."""
        return objectstore.is_remote(self.data_path)

    @property
    def extensions(self) -> tuple[str, ...]:
        """The DuckDB extensions this catalog needs."""
        scanner = {"sqlite": ("sqlite_scanner",), "postgres": ("postgres_scanner",)}.get(self.backend, ())
        return ("ducklake", *scanner, *(("httpfs",) if self.remote else ()))

    def attach_sql(self, alias: str, *, data_path: bool = True, read_only: bool = False,
                   override_data_path: bool = False) -> str:
        """The ATTACH statement; without `data_path`, the catalog's stored one applies (existing lakes).
        `override_data_path`: this URI's data path replaces the stored one (a moved or copied folder lake)."""
        opts = ["READ_ONLY"] if read_only else []
        opts += [f"DATA_PATH {sql_str(self.data_path)}"] if data_path else []
        if override_data_path:
            opts.append("OVERRIDE_DATA_PATH true")
        if self.metadata_schema:
            opts.append(f"METADATA_SCHEMA {sql_str(self.metadata_schema)}")
        if self.backend == "duckdb":
            # DuckLake inlines small inserts into a DuckDB-file catalog with DOUBLEs rounded to 16 digits
            # (0.09719760778190321 is read back as 0.0971976077819032): write every insert to parquet instead.
            opts.append("DATA_INLINING_ROW_LIMIT 0")
        options = f" ({', '.join(opts)})" if opts else ""
        return f"ATTACH {sql_str('ducklake:' + self.metadata)} AS {alias}{options}"

    @property
    def folder_data(self) -> bool:
        """Whether the data files are the local default beside the catalog (`PATH/data/`, `FILE.data/`), which
        moves and is copied with it."""
        return self.backend in ("duckdb", "sqlite") and not self.data_path_given

    def missing(self) -> str | None:
        """Why there is no lake here to read (None where one may be: a catalog file exists, or PostgreSQL,
        which only the attach can tell)."""
        if self.backend == "postgres":
            return None
        path = Path(self.metadata.removeprefix("sqlite:"))
        if path.is_dir():
            return f"{path} is a folder, not a catalog file"
        if not path.exists():
            where = path.parent if self.backend == "duckdb" else path
            return f"no lake at {where} (a write command such as collect or import creates one)"
        return None

    def prepare(self) -> None:
        """Create local folders the catalog and data need (nothing for remote paths)."""
        if self.backend in ("duckdb", "sqlite"):
            Path(self.metadata.removeprefix("sqlite:")).parent.mkdir(parents=True, exist_ok=True)
        if self.backend == "sqlite":
            _use_wal(self.metadata.removeprefix("sqlite:"))
        if not self.remote:
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
    except sqlite3.OperationalError as e:  # "database is locked": another process has it; a later open switches
        if "locked" not in str(e):
            raise
    finally:
        con.close()




def parse_uri(uri: str | os.PathLike | None) -> CatalogURI:
    """Parse a catalog URI; None means $TRAJLAKE_LAKE or `./lake`."""
    raw = str(uri) if uri is not None else os.environ.get(ENV_VAR) or DEFAULT_LAKE
    if not raw.strip():
        raise CatalogError("empty lake URI: give a folder, sqlite:FILE or postgres:CONNINFO")
    if raw.startswith("sqlite:"):
        path, data = _split_data_path(raw[len("sqlite:"):])
        if not path:
            raise CatalogError("sqlite: URI needs a file path, e.g. sqlite:lake/catalog.sqlite")
        path = str(Path(path).expanduser().absolute())
        if Path(path).is_dir():
            raise CatalogError(f"sqlite: URI names the folder {path}; give the catalog file in it, e.g. "
                               f"sqlite:{Path(path) / 'catalog.sqlite'}")
        return CatalogURI("sqlite", f"sqlite:{path}", data or path + ".data/", raw=raw, data_path_given=bool(data))
    if raw.startswith(("postgres:", "postgresql:")):
        conninfo = raw.split(":", 1)[1]
        pairs, extra = [], {}
        for token in conninfo.split():
            if "=" not in token:
                raise CatalogError(f"postgres URI part {token!r} is not key=value (libpq conninfo)")
            k, v = token.split("=", 1)
            if k in ("data_path", "metadata_schema"):
                if not v:
                    raise CatalogError(f"{k}= needs a value" + (": a folder or a URL such as s3://bucket/lake/"
                                                               if k == "data_path" else ": a PostgreSQL schema name"))
                extra[k] = v
            else:
                pairs.append(token)
        if not any(p.startswith("dbname=") for p in pairs):
            raise CatalogError("postgres URI needs dbname=..., e.g. postgres:dbname=trajlake host=127.0.0.1")
        given = extra.get("data_path")
        if given:
            objectstore.check_data_path(given)
        data = given or str(Path("lake_data").absolute()) + "/"
        return CatalogURI(
            "postgres", "postgres:" + " ".join(pairs), _dir(data), extra.get("metadata_schema"), raw, bool(given)
        )
    path, data = _split_data_path(raw)
    if ":" in path.split("/")[0] and not Path(path).exists():
        scheme = path.split(":", 1)[0]
        raise CatalogError(f"unknown lake URI scheme {scheme!r}: use a folder, sqlite:FILE or postgres:CONNINFO")
    if not path.strip():
        raise CatalogError("lake URI needs a folder before data_path=, e.g. lake data_path=s3://bucket/lake/")
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise CatalogError(f"lake path {folder} is a file; a DuckDB-file lake is a folder")
    return CatalogURI(
        "duckdb", str(folder / "catalog.ducklake"), data or str(folder / "data") + "/", raw=raw,
        data_path_given=bool(data),
    )


_DATA_PATH = re.compile(r"^(.*?)\s+data_path=(.*)$", re.DOTALL)


def _split_data_path(rest: str) -> tuple[str, str | None]:
    """Split `PATH data_path=DATA` (folder and sqlite forms) into PATH and DATA (a folder, made absolute, or
    a URL), ending in `/`; DATA is None when not given."""
    m = _DATA_PATH.match(rest)
    if not m:
        return rest, None
    path, data = m.group(1), m.group(2).strip()
    if not data:
        raise CatalogError("data_path= needs a value: a folder or a URL such as s3://bucket/lake/")
    objectstore.check_data_path(data)
    if not objectstore.is_remote(data):
        data = str(Path(data).expanduser().absolute())
    return path, _dir(data)


def _dir(path: str) -> str:
    return path if path.endswith("/") else path + "/"
