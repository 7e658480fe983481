"""A local S3 server for the object-storage tests (a pytest plugin, named in conftest.py's pytest_plugins):
moto on 127.0.0.1 with its credential checks on. Its fixtures skip, saying why, when moto or the httpfs
extension package is missing."""

from __future__ import annotations

import importlib.util
import json
import uuid

import pytest

from trajlake.store import objectstore

HTTPFS = importlib.util.find_spec("duckdb_extension_httpfs") is not None


class S3:
    """A moto S3 server: endpoint, a valid access key, and a boto3 client using it."""

    def __init__(self, endpoint: str, key_id: str, secret: str):
        import boto3

        self.endpoint, self.key_id, self.secret = endpoint, key_id, secret
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
            region_name="us-east-1",
        )

    def bucket(self) -> str:
        name = "trajlake-" + uuid.uuid4().hex[:12]
        self.client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 (and IAM) server on 127.0.0.1 that checks signatures: only the key it issued works. One per test
    process: moto keeps its accounts process-wide, so a second server would find the first one's user."""
    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto is not installed: pip install -e '.[dev]' (moto[server]) to test object storage")
    if not HTTPFS:
        pytest.skip("duckdb-extension-httpfs is not installed: pip install -e '.[s3]'")
    import boto3
    import requests
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        iam = boto3.client(
            "iam", endpoint_url=endpoint, aws_access_key_id="setup", aws_secret_access_key="setup",
            region_name="us-east-1",
        )
        iam.create_user(UserName="trajlake")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="trajlake", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="trajlake")["AccessKey"]
        # from now on every request must be signed with a key moto issued (moto's process-wide switch)
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        yield S3(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"inf", timeout=10)
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The server, with the AWS variables of this process pointing at it."""
    for var in objectstore.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    return s3_server
