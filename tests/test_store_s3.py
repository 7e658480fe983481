"""Object storage: a lake whose parquet files live on S3, tested for real against a local S3 server (moto,
on 127.0.0.1, with its credential checks on), with a sqlite, a DuckDB-file and (when one answers) a
PostgreSQL catalog. The moto tests skip, saying why, when moto or the httpfs extension package is missing."""

from __future__ import annotations

import importlib.util
import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from trajlake.core.errors import CatalogError, TrajlakeError
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake, extensions, objectstore, parse_uri

CONTENT = "SELECT episode_id, num_turns, status FROM episodes ORDER BY episode_id"
AWS_VARS = objectstore.ENV_VARS


def pg_conninfo() -> str:  # as conftest's (the pg_schema fixture skips when no server answers)
    return os.environ.get("TRAJLAKE_TEST_PG", "dbname=test host=127.0.0.1 user=postgres")


def catalog_uri(backend: str, tmp_path: Path, request) -> str:
    """A catalog on `backend` with no data path (add ` data_path=...`)."""
    if backend == "duckdb":
        return str(tmp_path / "lake")
    if backend == "sqlite":
        return f"sqlite:{tmp_path / 'catalog.sqlite'}"
    return f"postgres:{pg_conninfo()} metadata_schema={request.getfixturevalue('pg_schema')}"


@pytest.fixture(params=["sqlite", "postgres", "duckdb"])
def backend(request) -> str:
    return request.param


def episodes(prefix: str, n: int, status: str = "ok") -> dict[str, list]:
    eps = [Episode(f"{prefix}-{i:03d}", num_turns=2, status=status) for i in range(n)]
    turns = [Turn(e.episode_id, t, action=f"a{t}", step_reward=0.5 * t) for e in eps for t in range(2)]
    return {"episodes": eps, "turns": turns}


def catalog_text(backend: str, uri: str, tmp_path: Path) -> str:
    """Everything the catalog stores, as text (files as bytes decoded leniently; PostgreSQL rows)."""
    if backend != "postgres":
        files = [p for p in tmp_path.rglob("*") if p.is_file() and ("catalog" in p.name)]
        assert files
        return "".join(p.read_bytes().decode("latin-1") for p in files)
    import psycopg

    schema = uri.split("metadata_schema=")[1].split()[0]
    with psycopg.connect(pg_conninfo()) as con:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema]
        ).fetchall()]
        return "".join(
            str(con.execute(f'SELECT string_agg(t::text, \'\') FROM "{schema}"."{t}" t').fetchone()[0])
            for t in tables
        )


# ---- against the server ----------------------------------------------------------------------------
def test_roundtrip_time_travel_and_objects_in_the_bucket(s3, backend, tmp_path, request):
    bucket = s3.bucket()
    base = catalog_uri(backend, tmp_path, request)
    uri = f"{base} data_path=s3://{bucket}/lake/"
    with Lake.open(uri) as lake:
        assert lake.catalog.remote and lake.catalog.data_path == f"s3://{bucket}/lake/"
        first = lake.append(episodes("a", 15), stage="collect", run_id="r1").snapshot_id
        rows_first = lake.query(CONTENT).rows()
        lake.append(episodes("b", 3, status="late"), stage="collect", run_id="r2")  # inlined in a catalog db
        lake.update("episodes", {"episode_id": "a-000"}, {"status": "curated"}, stage="curate")
        assert lake.count("episodes") == 18 and lake.count("turns") == 36
        assert lake.query("SELECT status FROM episodes WHERE episode_id = 'a-000'")["status"][0] == "curated"
        got = lake.query("SELECT sum(step_reward) AS r FROM turns WHERE episode_id LIKE 'a-%'")["r"][0]
        assert got == pytest.approx(15 * 0.5)
        assert lake.query(CONTENT, snapshot=first).rows() == rows_first  # time travel
        assert lake.count("episodes", snapshot=first) == 15
        stages = lake.snapshots()["stage"].to_list()
        assert stages[-3:] == ["collect", "collect", "curate"]

    keys = s3.keys(bucket)
    assert keys and all(k.startswith("lake/main/") and k.endswith(".parquet") for k in keys), keys
    assert any(k.startswith("lake/main/episodes/") for k in keys)
    assert any(k.startswith("lake/main/turns/") for k in keys)
    assert not (tmp_path / "catalog.sqlite.data").exists() and not (tmp_path / "lake" / "data").exists()

    # the catalog remembers where its data is: the URI without data_path opens the same lake
    with Lake.open(base) as lake:
        assert lake.catalog.data_path == f"s3://{bucket}/lake/"
        assert lake.count("episodes") == 18 and lake.query(CONTENT, snapshot=first).rows() == rows_first
    assert not (tmp_path / "catalog.sqlite.data").exists() and not (tmp_path / "lake" / "data").exists()
    with pytest.raises(CatalogError, match="does not match.*leave data_path out"):
        Lake.open(f"{base} data_path=s3://{bucket}/elsewhere/")

    # the credentials live only in the connection's memory
    text = catalog_text(backend, uri, tmp_path)
    assert f"s3://{bucket}/lake/" in text  # (the search does see the catalog's contents)
    assert s3.secret not in text and s3.key_id not in text


def test_secret_is_temporary_and_redacted(s3, tmp_path):
    bucket = s3.bucket()
    with Lake.open(f"sqlite:{tmp_path / 'c.sqlite'} data_path=s3://{bucket}/x/") as lake:
        sql = "SELECT name, type, persistent, storage, secret_string FROM duckdb_secrets()"
        rows = lake._con.execute(sql).fetchall()
    assert [r[:4] for r in rows] == [(objectstore.SECRET_NAME, "s3", False, "memory")]
    assert s3.secret not in rows[0][4] and "127.0.0.1" in rows[0][4]


def test_maintain_flushes_merges_and_deletes_remote_files(s3, backend, tmp_path, request):
    bucket = s3.bucket()
    uri = f"{catalog_uri(backend, tmp_path, request)} data_path=s3://{bucket}/lake/"
    with Lake.open(uri) as lake:
        history = {}
        for i in range(4):  # alternately parquet (12 rows) and inlined in sqlite/postgres (2 rows)
            snap = lake.append(episodes(f"m{i}", 2 if i % 2 else 12, status=f"s{i}"), stage="collect").snapshot_id
            history[snap] = lake.query(CONTENT).rows()
        orphan = "lake/main/episodes/orphan-from-a-dead-writer.parquet"
        s3.client.put_object(Bucket=bucket, Key=orphan, Body=b"not parquet")
        before = s3.keys(bucket)

        done = lake.maintain()  # nothing younger than the grace period goes
        assert done["old_files_deleted"] == 0 and done["orphans_deleted"] == 0
        assert before <= s3.keys(bucket)

        done = lake.maintain(grace=timedelta(0))
        assert done["old_files_deleted"] > 0 and done["orphans_deleted"] == 1
        after = s3.keys(bucket)
        assert orphan not in after and not before <= after
        # a multi-process catalog's write token (store.write.WRITE_TOKEN) is flushed to a file of its own too
        tables = {"episodes", "turns"} | ({"write_token"} if backend != "duckdb" else set())
        assert {k.split("/")[2] for k in after} == tables
        for snap, rows in history.items():
            assert lake.query(CONTENT, snapshot=snap).rows() == rows
        assert lake.count("turns") == 2 * lake.count("episodes") == 2 * 28


def test_cli_maintain_on_object_storage(s3, tmp_path, capsys):
    from trajlake.cli import main

    bucket = s3.bucket()
    uri = f"sqlite:{tmp_path / 'c.sqlite'} data_path=s3://{bucket}/lake/"
    with Lake.open(uri) as lake:
        lake.append(episodes("c", 3), stage="collect")  # inlined: no object yet
    assert not s3.keys(bucket)
    assert main(["--lake", uri, "maintain", "--grace", "0s"]) == 0
    assert "orphans_deleted" in capsys.readouterr().out
    assert s3.keys(bucket)  # flushed to parquet on S3
    with Lake.open(uri) as lake:
        assert lake.count("turns") == 6


def test_wrong_credentials_fail_clearly_and_keep_the_stored_data(s3, backend, tmp_path, request, monkeypatch):
    bucket = s3.bucket()
    uri = f"{catalog_uri(backend, tmp_path, request)} data_path=s3://{bucket}/lake/"
    with Lake.open(uri) as lake:
        lake.append(episodes("ok", 15), stage="collect")
        stored = lake.query(CONTENT).rows()
        snaps = len(lake.snapshots())
    objects = s3.keys(bucket)

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with Lake.open(uri) as lake:  # opening reads only the catalog
        with pytest.raises(TrajlakeError) as write:
            lake.append(episodes("bad", 15), stage="collect")
        with pytest.raises(TrajlakeError) as read:
            lake.query(CONTENT)
    for info in (write, read):
        msg = str(info.value)
        assert "403" in msg and "SignatureDoesNotMatch" in msg and "AWS_SECRET_ACCESS_KEY" in msg, msg
        assert f"s3://{bucket}/lake/" in msg and "wrong-secret" not in msg and s3.secret not in msg
        assert "\n" not in msg
    assert "nothing was stored" in str(write.value)

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    with Lake.open(uri) as lake:
        assert lake.query(CONTENT).rows() == stored and len(lake.snapshots()) == snaps
    assert s3.keys(bucket) == objects


def test_missing_bucket_fails_clearly_until_it_exists(s3, tmp_path):
    bucket = "trajlake-missing-" + uuid.uuid4().hex[:8]
    uri = f"sqlite:{tmp_path / 'c.sqlite'} data_path=s3://{bucket}/lake/"
    with Lake.open(uri) as lake:
        lake.append(episodes("small", 2), stage="collect")  # inlined in the catalog: no S3 request
        with pytest.raises(TrajlakeError) as info:
            lake.append(episodes("big", 15), stage="collect")
        msg = str(info.value)
        assert "nothing was stored" in msg and "404" in msg and "NoSuchBucket" in msg, msg
        assert "that the bucket exists" in msg
        assert lake.count("episodes") == 2 and lake.count("turns") == 4  # the stored data is still readable

        s3.client.create_bucket(Bucket=bucket)
        lake.append(episodes("big", 15), stage="collect")
        assert lake.count("episodes") == 17
    assert s3.keys(bucket)


def test_anonymous_access_refused_is_a_clear_error(s3, tmp_path, monkeypatch):
    """With only the endpoint set, requests go unsigned, and this server refuses them (moto: with HTTP 500)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path))  # no persistent DuckDB secrets of the user's
    bucket = s3.bucket()
    with Lake.open(f"sqlite:{tmp_path / 'c.sqlite'} data_path=s3://{bucket}/lake/") as lake:
        with pytest.raises(TrajlakeError) as info:
            lake.append(episodes("x", 15), stage="collect")
    msg = str(info.value)
    assert "nothing was stored" in msg and "HTTP" in msg and f"s3://{bucket}/lake/: check AWS_" in msg, msg
    assert not s3.keys(bucket)


# ---- without a server --------------------------------------------------------------------------------
def test_missing_httpfs_package_names_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        extensions.importlib.util, "find_spec",
        lambda name, *a: None if name == "duckdb_extension_httpfs" else real(name, *a),
    )
    with pytest.raises(TrajlakeError) as info:
        Lake.open(f"sqlite:{tmp_path / 'c.sqlite'} data_path=s3://bucket/lake/")
    msg = str(info.value)
    assert "pip install 'trajlake[s3]'" in msg and "httpfs" in msg and "object storage" in msg, msg
    with Lake.open(f"sqlite:{tmp_path / 'local.sqlite'}") as lake:  # a local lake does not need it
        lake.append(episodes("l", 2), stage="collect")
        assert lake.count("episodes") == 2
    extensions.connect().close()  # nor does the default set of extensions


def test_uris_with_a_data_path(tmp_path):
    c = parse_uri("sqlite:cat.sqlite data_path=s3://bucket/prefix")
    assert (c.backend, c.metadata, c.data_path) == ("sqlite", f"sqlite:{tmp_path / 'cat.sqlite'}", "s3://bucket/prefix/")
    assert c.remote and c.data_path_given and "httpfs" in c.extensions
    assert "DATA_PATH 's3://bucket/prefix/'" in c.attach_sql("lake")

    c = parse_uri("my lake data_path=s3://bucket/p/")  # the folder form: the catalog stays in the folder
    assert (c.backend, c.metadata, c.data_path) == ("duckdb", str(tmp_path / "my lake" / "catalog.ducklake"),
                                                    "s3://bucket/p/")
    c = parse_uri("postgres:dbname=x host=h data_path=gs://b/p/ metadata_schema=s")
    assert c.remote and c.extensions == ("ducklake", "postgres_scanner", "httpfs")
    assert parse_uri("sqlite:c.sqlite data_path=local/data").data_path == str(tmp_path / "local" / "data") + "/"

    for uri in ("lake", "sqlite:c.sqlite", "postgres:dbname=x", "postgres:dbname=x data_path=/mnt/d"):
        c = parse_uri(uri)
        assert not c.remote and "httpfs" not in c.extensions
        assert c.data_path_given == uri.endswith("/mnt/d")
    assert "DATA_PATH" not in parse_uri("sqlite:c.sqlite").attach_sql("lake", data_path=False)


@pytest.mark.parametrize("uri,words", [
    ("sqlite:c.sqlite data_path=az://container/p/", ["az://", "not supported"]),
    ("postgres:dbname=x data_path=abfss://c@a/p", ["abfss://", "not supported"]),
    ("lake data_path=ftp://host/p", ["ftp://"]),
    ("sqlite:c.sqlite data_path=", ["data_path= needs a value"]),
    (" data_path=s3://b/p/", ["needs a folder"]),
])
def test_bad_data_paths(uri, words):
    with pytest.raises(CatalogError) as info:
        parse_uri(uri)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_secret_from_the_environment():
    assert objectstore.s3_secret_sql({}) is None
    assert objectstore.s3_secret_sql({"AWS_REGION": "  ", "HOME": "/root"}) is None
    sql = objectstore.s3_secret_sql({
        "AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "se'cret", "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-2", "AWS_ENDPOINT_URL": "http://minio:9000/",
    })
    assert sql.startswith("CREATE OR REPLACE TEMPORARY SECRET trajlake_s3 (TYPE s3, ")
    for part in ("KEY_ID 'AKIA1'", "SECRET 'se''cret'", "SESSION_TOKEN 'tok'", "REGION 'eu-west-1'",
                 "ENDPOINT 'minio:9000'", "URL_STYLE 'path'", "USE_SSL false"):
        assert part in sql, sql
    sql = objectstore.s3_secret_sql({"AWS_DEFAULT_REGION": "us-east-2", "AWS_ENDPOINT_URL": "https://s3.example.com",
                                     "AWS_ENDPOINT_URL_S3": "https://objects.example.com"})
    assert "REGION 'us-east-2'" in sql and "ENDPOINT 'objects.example.com'" in sql and "USE_SSL true" in sql
    assert "KEY_ID" not in sql  # anonymous access to an S3-compatible server
    sql = objectstore.s3_secret_sql({"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s"})
    assert "ENDPOINT" not in sql and "URL_STYLE" not in sql  # AWS itself
    with pytest.raises(TrajlakeError, match="AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"):
        objectstore.s3_secret_sql({"AWS_ACCESS_KEY_ID": "AKIA1"})
    with pytest.raises(TrajlakeError, match="AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not"):
        objectstore.s3_secret_sql({"AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(TrajlakeError, match="not an http"):
        objectstore.s3_secret_sql({"AWS_ENDPOINT_URL": "ftp://x"})


def test_explain_keeps_local_errors_and_never_adds_secrets():
    assert objectstore.explain("Binder Error: x\nmore", "/tmp/data/") == "Binder Error: x"
    assert objectstore.explain("Binder Error: x\nmore", "s3://b/p/") == "Binder Error: x"
    msg = objectstore.explain(
        "HTTP Error: Unable to connect to URL s3://b/p/f.parquet: Forbidden (HTTP code 403)\n\n"
        "InvalidAccessKeyId: The AWS Access Key Id you provided does not exist in our records.\n",
        "s3://b/p/",
    )
    assert msg.startswith("HTTP Error: Unable to connect") and "(InvalidAccessKeyId: The AWS" in msg
    assert msg.endswith("check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL and that "
                        "the bucket exists")
