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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trajlake.core.errors import CatalogError
from trajlake.core.registry import Registry
from trajlake.core.sql_text import sql_str
from trajlake.store import objectstore

DEFAULT_LAKE = "lake"
ENV_VAR = "TRAJLAKE_LAKE"


@dataclass(frozen=True, kw_only=True)
class Backend:
    """A kind of catalog: how its URI reads and what DuckLake needs of it. Each is one registration in
    CATALOGS; nothing else in the store compares catalog names."""

    name: str
    """The name (`CatalogURI.backend`): duckdb, sqlite, postgres."""
    schemes: tuple[str, ...]
    """URI prefixes that pick it (`sqlite:`); none for the default, a bare folder path."""
    parse: Callable[[str, str], CatalogURI]
    """(the URI after the scheme, the whole URI) -> the parsed URI; raises CatalogError naming what is wrong."""
    multi_process: bool
    """Whether several processes may open the lake at once."""
    scanner: str | None = None
    """The DuckDB extension that reads the catalog database, if not DuckDB itself."""
    catalog_file: bool = False
    """Whether the catalog is a local file (it can be missing, moved or copied; its folders are made)."""
    folder_lake: bool = False
    """Whether the URI names the folder that holds the catalog file (the lake is that folder)."""
    attach_options: tuple[str, ...] = ()
    """Extra ATTACH options this catalog always gets."""
    prepare: Callable[[str], None] | None = None
    """Run on the catalog file's path before a write open (e.g. SQLite's WAL mode)."""
    missing_on_read_only: tuple[str, ...] = ()
    """Error texts of a read-only attach that mean there is no lake there (DuckLake tried to create one)."""
    cleanup_in_transaction: bool = False
    """Whether file cleanup must run in one transaction with its check (SQLite: the scheduled files could
    change between them)."""
    magic: tuple[int, bytes] | None = None
    """(offset, bytes) every catalog file of this kind holds, so a file of another kind is told apart before
    anything opens or prepares it (a text file given as the lake ended as "internal error (DatabaseError)")."""
    label: str = ""
    """The database's name for messages (DuckDB, SQLite)."""


#: every catalog backend, by name
CATALOGS: Registry[Backend] = Registry("catalog backend")


@dataclass(frozen=True)
class CatalogURI:
    """A parsed catalog URI."""

    backend: str  # a name in CATALOGS: "duckdb" | "sqlite" | "postgres"
    metadata: str  # what follows `ducklake:` in the ATTACH string
    data_path: str
    metadata_schema: str | None = None
    raw: str = ""
    data_path_given: bool = False  # False: data_path is the backend's default

    @property
    def kind(self) -> Backend:
        return CATALOGS[self.backend]

    @property
    def multi_process(self) -> bool:
        return self.kind.multi_process

    @property
    def remote(self) -> bool:
        """Whether the data files are on object storage (a URL)."""
        return objectstore.is_remote(self.data_path)

    @property
    def extensions(self) -> tuple[str, ...]:
        """The DuckDB extensions this catalog needs."""
        scanner = (self.kind.scanner,) if self.kind.scanner else ()
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
        opts += self.kind.attach_options
        options = f" ({', '.join(opts)})" if opts else ""
        return f"ATTACH {sql_str('ducklake:' + self.metadata)} AS {alias}{options}"

    @property
    def catalog_path(self) -> Path | None:
        """The catalog file (None where the catalog is a database server)."""
        return Path(self.metadata.removeprefix(f"{self.backend}:")) if self.kind.catalog_file else None

    @property
    def folder_data(self) -> bool:
        """Whether the data files are the local default beside the catalog (`PATH/data/`, `FILE.data/`), which
        moves and is copied with it."""
        return self.kind.catalog_file and not self.data_path_given

    def missing(self) -> str | None:
        """Why there is no lake here to read (None where one may be: a catalog file exists, or a database
        server, which only the attach can tell)."""
        path = self.catalog_path
        if path is None:
            return None
        if path.is_dir():
            return f"{path} is a folder, not a catalog file"
        if not path.exists():
            where = path.parent if self.kind.folder_lake else path
            return f"no lake at {where} (a write command such as collect or import creates one)"
        return self.not_a_catalog()

    def not_a_catalog(self) -> str | None:
        """Why the catalog file is not one (a file of another kind; None: it may be, or there is none yet). An
        empty file is left to the database, which makes a new catalog in it."""
        path, magic = self.catalog_path, self.kind.magic
        if path is not None and path.exists() and not path.is_file() and not path.is_dir():
            # sqlite:/dev/null opened a database on the device and made /dev/null.data and /dev/null-journal
            return f"{path} is not a file (a device, FIFO or socket): a catalog is a file of its own"
        if path is None or magic is None or not path.is_file() or path.stat().st_size == 0:
            return None
        offset, expected = magic
        with open(path, "rb") as f:
            head = f.read(offset + len(expected))
        if head[offset:] == expected:
            return None
        return f"{path} is not a {self.kind.label} database (a file of another kind); a new lake needs a new path"

    def prepare(self) -> None:
        """Create local folders the catalog and data need (nothing for remote paths); a catalog file of another
        kind is refused first, so nothing is made beside it."""
        path = self.catalog_path
        why = self.not_a_catalog()
        if why:
            raise CatalogError(f"cannot open lake {self.raw}: {why}")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.kind.prepare:
                self.kind.prepare(str(path))
        if not self.remote:
            Path(self.data_path).mkdir(parents=True, exist_ok=True)


def _use_wal(path: str) -> None:
    """Put a SQLite catalog in WAL mode (persistent, so this acts once per file).

    In SQLite's default rollback-journal mode, concurrent DuckLake transactions on one catalog (threads
    of one process, or several processes) can deadlock each other in SQLite's busy handler; in WAL mode
    readers never block the writer. If another process holds the file so the mode cannot change now,
    the lake still opens, and a later open switches it.
    """
    try:
        con = sqlite3.connect(path, timeout=10)
    except sqlite3.Error as e:  # a folder that cannot hold a file (/proc), no permission
        raise CatalogError(f"cannot open lake sqlite:{path}: {e}") from None
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as e:  # "database is locked": another process has it; a later open switches
        if "locked" not in str(e):
            raise CatalogError(f"cannot open lake sqlite:{path}: {e}") from None
    except sqlite3.DatabaseError as e:  # "file is not a database": a text file, say, given as sqlite:FILE
        raise CatalogError(f"cannot open lake sqlite:{path}: {path} is not a SQLite database ({e}); a new lake "
                           "needs a new path") from None
    finally:
        con.close()




def parse_uri(uri: str | os.PathLike | None) -> CatalogURI:
    """Parse a catalog URI; None means $TRAJLAKE_LAKE or `./lake`."""
    raw = str(uri) if uri is not None else os.environ.get(ENV_VAR) or DEFAULT_LAKE
    if not raw.strip():
        raise CatalogError("empty lake URI: give a folder, sqlite:FILE or postgres:CONNINFO")
    backends = [backend for _, backend in CATALOGS.items()]
    for backend in backends:
        for scheme in backend.schemes:
            if raw.startswith(scheme + ":"):
                return backend.parse(raw[len(scheme) + 1:], raw)
    path = _split_data_path(raw)[0]
    if ":" in path.split("/")[0] and not Path(path).exists():
        scheme = path.split(":", 1)[0]
        schemes = ", ".join(f"{s}:..." for backend in backends for s in backend.schemes)
        raise CatalogError(f"unknown lake URI scheme {scheme!r}: use a folder, or one of {schemes}")
    folder = next(backend for backend in backends if not backend.schemes)  # the default: a bare folder path
    return folder.parse(raw, raw)


def _parse_sqlite(rest: str, raw: str) -> CatalogURI:
    path, data = _split_data_path(rest)
    if not path:
        raise CatalogError("sqlite: URI needs a file path, e.g. sqlite:lake/catalog.sqlite")
    path = str(Path(path).expanduser().absolute())
    if Path(path).is_dir():
        raise CatalogError(f"sqlite: URI names the folder {path}; give the catalog file in it, e.g. "
                           f"sqlite:{Path(path) / 'catalog.sqlite'}")
    return CatalogURI("sqlite", f"sqlite:{path}", data or path + ".data/", raw=raw, data_path_given=bool(data))


def _parse_postgres(conninfo: str, raw: str) -> CatalogURI:
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


def _parse_folder(rest: str, raw: str) -> CatalogURI:
    path, data = _split_data_path(rest)
    if not path.strip():
        raise CatalogError("lake URI needs a folder before data_path=, e.g. lake data_path=s3://bucket/lake/")
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise CatalogError(f"lake path {folder} is a file; a DuckDB-file lake is a folder")
    return CatalogURI(
        "duckdb", str(folder / "catalog.ducklake"), data or str(folder / "data") + "/", raw=raw,
        data_path_given=bool(data),
    )


CATALOGS.add("duckdb", Backend(
    name="duckdb", schemes=(), parse=_parse_folder, multi_process=False, catalog_file=True, folder_lake=True,
    # DuckLake inlines small inserts into a DuckDB-file catalog with DOUBLEs rounded to 16 digits
    # (0.09719760778190321 is read back as 0.0971976077819032): write every insert to parquet instead.
    attach_options=("DATA_INLINING_ROW_LIMIT 0",), magic=(8, b"DUCK"), label="DuckDB"))
CATALOGS.add("sqlite", Backend(
    name="sqlite", schemes=("sqlite",), parse=_parse_sqlite, multi_process=True, scanner="sqlite_scanner",
    catalog_file=True, prepare=_use_wal, cleanup_in_transaction=True, magic=(0, b"SQLite format 3\x00"),
    label="SQLite"))
CATALOGS.add("postgres", Backend(
    name="postgres", schemes=("postgres", "postgresql"), parse=_parse_postgres, multi_process=True,
    scanner="postgres_scanner", missing_on_read_only=("read-only mode", "creating a new DuckLake")))


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
