"""Object storage for a lake's data files, through DuckDB's httpfs extension (`pip install 'trajlake[s3]'`).

A lake whose `data_path` is a URL (`s3://`, `gs://`, `r2://`, `https://`, ...) loads httpfs; for the S3
schemes, the standard AWS environment variables become a temporary, in-memory DuckDB secret (see
`s3_secret_sql`): credentials are never written to the catalog, the data files or an error message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import duckdb

from trajlake.core.errors import CatalogError, TrajlakeError
from trajlake.core.sql_text import sql_str

#: URL schemes DuckDB's httpfs extension reads and writes (http(s) and hf are read-only there)
HTTPFS_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "r2", "http", "https", "hf")
#: the schemes the AWS environment variables configure
S3_SCHEMES = ("s3", "s3a", "s3n")
#: the environment variables read, in the order documented
ENV_VARS = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
)
SECRET_NAME = "trajlake_s3"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(path: str) -> str | None:
    """The URL scheme of `path` (lower case), or None for a local path."""
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str) -> bool:
    return scheme(path) is not None


def check_data_path(path: str) -> None:
    """Raise a CatalogError for a URL data path httpfs cannot serve."""
    s = scheme(path)
    if s is not None and s not in HTTPFS_SCHEMES:
        raise CatalogError(
            f"data_path {path!r}: object storage {s}:// is not supported; use s3:// (any S3-compatible server, "
            f"with AWS_ENDPOINT_URL), gs://, r2:// or https://"
        )


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def s3_secret_sql(environ: Mapping[str, str] | None = None) -> str | None:
    """`CREATE TEMPORARY SECRET` for s3:// from the AWS environment variables, or None when none is set
    (then DuckDB's own secrets, e.g. persistent ones made in the duckdb CLI, or anonymous access apply).

    AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) are the credentials; AWS_REGION, else
    AWS_DEFAULT_REGION, the region; AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, an S3-compatible server
    (MinIO, Ceph, R2, ...): `http://` there turns TLS off, and an endpoint implies path-style URLs.
    """
    env = os.environ if environ is None else environ
    if not any(_env(env, v) for v in ENV_VARS):
        return None
    key_id, secret = _env(env, "AWS_ACCESS_KEY_ID"), _env(env, "AWS_SECRET_ACCESS_KEY")
    if bool(key_id) != bool(secret):
        have, missing = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
        if secret:
            have, missing = missing, have
        raise TrajlakeError(f"{have} is set but {missing} is not: set both (or neither, for anonymous access)")
    opts = ["TYPE s3"]
    if key_id:
        opts += [f"KEY_ID {sql_str(key_id)}", f"SECRET {sql_str(secret)}"]
        if token := _env(env, "AWS_SESSION_TOKEN"):
            opts.append(f"SESSION_TOKEN {sql_str(token)}")
    if region := _env(env, "AWS_REGION") or _env(env, "AWS_DEFAULT_REGION"):
        opts.append(f"REGION {sql_str(region)}")
    if endpoint := _env(env, "AWS_ENDPOINT_URL_S3") or _env(env, "AWS_ENDPOINT_URL"):
        url_scheme = scheme(endpoint)
        if url_scheme not in (None, "http", "https"):
            raise TrajlakeError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http:// or https:// URL")
        host = endpoint.split("://", 1)[-1].rstrip("/")
        opts += [f"ENDPOINT {sql_str(host)}", "URL_STYLE 'path'", f"USE_SSL {str(url_scheme != 'http').lower()}"]
    return f"CREATE OR REPLACE TEMPORARY SECRET {SECRET_NAME} ({', '.join(opts)})"


def configure(con: duckdb.DuckDBPyConnection, data_path: str) -> None:
    """Give `con` (httpfs loaded) the credentials for `data_path` from the environment."""
    if scheme(data_path) not in S3_SCHEMES:
        return
    sql = s3_secret_sql()
    if sql is None:
        return
    try:
        con.execute(sql)
    except duckdb.Error as e:  # the statement holds the credentials: never show it
        raise TrajlakeError(f"cannot set up S3 credentials from AWS_* variables: {type(e).__name__}") from None


def explain(message: str, data_path: str) -> str:
    """One line for a DuckDB error on a lake whose data is remote: the error, the server's error code, and
    what to check. Other errors come back as their first line."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return message
    first = lines[0]
    if not is_remote(data_path) or not re.search(r"\bHTTP\b|IO Error|Could not resolve|Unable to connect", first):
        return first
    code = next((ln for ln in lines[1:] if re.match(r"^[A-Z][A-Za-z]+: ", ln)), None)
    why = f" ({code[:160]})" if code else ""
    check = "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL" \
        if scheme(data_path) in S3_SCHEMES else "the credentials (DuckDB secrets)"
    return f"{first}{why}; the lake's data is at {data_path}: check {check} and that the bucket exists"


