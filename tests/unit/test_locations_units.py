"""Table locations without a JVM: the delta-rs options derived from Hadoop settings, the
local fallback qualification, and the rule that the table layer never touches a table path
through the local file system."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from streaming_merge.errors import StorageOptionError, StreamingMergeError
from streaming_merge.table.location import TableLocation, resolve
from streaming_merge.table.storage_options import storage_options_for

ROOT = Path(__file__).resolve().parents[2]


def _getter(conf: dict[str, str]):  # type: ignore[no-untyped-def]
    return conf.get


def test_s3a_settings_become_delta_rs_options_with_per_bucket_overrides() -> None:
    conf = {
        "fs.s3a.access.key": "AK-global",
        "fs.s3a.secret.key": "SK-global",
        "fs.s3a.bucket.lake.access.key": "AK-lake",
        "fs.s3a.endpoint": "minio:9000",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.endpoint.region": "eu-west-1",
    }
    assert storage_options_for("s3a://lake/orders", _getter(conf)) == {
        "AWS_ACCESS_KEY_ID": "AK-lake",  # the bucket's own key wins
        "AWS_SECRET_ACCESS_KEY": "SK-global",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }
    assert storage_options_for("s3a://other/t", _getter(conf))["AWS_ACCESS_KEY_ID"] == "AK-global"
    https = storage_options_for("s3://b/t", _getter({"fs.s3a.endpoint": "s3.example.com"}))
    assert https == {"AWS_ENDPOINT_URL": "https://s3.example.com"}


def test_azure_account_key_and_oauth_settings() -> None:
    host = "acct.dfs.core.windows.net"
    key = storage_options_for(f"abfss://data@{host}/t", _getter({f"fs.azure.account.key.{host}": "KEY"}))
    assert key == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "KEY"}
    oauth = storage_options_for(f"abfss://data@{host}/t", _getter({
        f"fs.azure.account.oauth2.client.id.{host}": "CID",
        f"fs.azure.account.oauth2.client.secret.{host}": "SECRET",
        f"fs.azure.account.oauth2.client.endpoint.{host}": "https://login.microsoftonline.com/TENANT/oauth2/token",
    }))
    assert oauth == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_CLIENT_ID": "CID",
                     "AZURE_CLIENT_SECRET": "SECRET", "AZURE_TENANT_ID": "TENANT"}


def test_gcs_keyfile_and_schemes_without_a_mapping() -> None:
    assert storage_options_for("gs://b/t", _getter({"google.cloud.auth.service.account.json.keyfile": "/k.json"})) \
        == {"GOOGLE_SERVICE_ACCOUNT": "/k.json"}
    assert storage_options_for("file:/lake/t", _getter({"fs.s3a.access.key": "AK"})) == {}
    assert storage_options_for("hdfs://nn:8020/lake/t", _getter({})) == {}


def test_without_a_session_paths_are_local_and_uris_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", staticmethod(lambda: None))
    monkeypatch.chdir(tmp_path)
    spellings = ["t", str(tmp_path / "t"), f"file://{tmp_path}/t", f"file:{tmp_path}/t/", f"{tmp_path}/x/../t"]
    locations = {resolve(s) for s in spellings}
    assert locations == {TableLocation(f"file:{tmp_path}/t", f"file://{tmp_path}/t")}
    spaced = resolve(str(tmp_path / "a b%#é"))
    assert spaced.uri == f"file:{tmp_path}/a b%#é"
    assert spaced.log_uri == f"file://{tmp_path}/a%20b%25%23%C3%A9"
    assert resolve("s3a://bucket/t/").uri == "s3a://bucket/t"
    with_options = resolve("s3a://bucket/t", storage_options={"AWS_REGION": "eu-west-1"})
    assert with_options.options == {"AWS_REGION": "eu-west-1"}
    assert resolve(with_options, storage_options={"AWS_ALLOW_HTTP": "true"}).options == {
        "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    with pytest.raises(ValueError, match="non-empty path or URI"):
        resolve("  ")


# Local file system calls that must never be made on a table path: the data files go through
# Spark's Hadoop FileSystem (table/files.py), the log through delta-rs.
_LOCAL_FS = re.compile(
    r"os\.path\.(isdir|isfile|exists|getsize|getmtime|join|relpath)|os\.(listdir|makedirs|mkdir|remove|unlink|"
    r"rename|replace|walk|scandir|stat)\b|shutil\.|pathlib|(?<!\.)\bPath\(|pyarrow\.fs|pafs\.|(?<!\.)\bopen\(")


def test_the_table_layer_makes_no_local_file_system_call() -> None:
    """Every module of the package but the Kafka client code (no table paths there), the
    session helper and the driver's own process files (the class-data-sharing archive in the
    user's cache, the start-up marks, the interpreter Spark's Python data source look-up runs,
    the Ivy cache of the Spark packages, Spark's own configuration folder).
    ``location.py`` may spell a local path (abspath/normpath
    are string operations) for a driver-side read without any SparkSession."""
    package = ROOT / "streaming_merge"
    process_files = {("spark", "class_archive.py"), ("spark", "startup_marks.py"), ("spark", "python_sources.py"),
                     ("spark", "packages.py"), ("spark", "given_conf.py")}
    modules = [m for m in sorted(package.rglob("*.py"))
               if m.relative_to(package).parts[0] not in ("kafka", "session.py")
               and m.relative_to(package).parts not in process_files]
    assert {"write.py", "snapshot.py", "commit.py", "sink.py", "delta_table.py"} <= {m.name for m in modules}
    offending = [f"{module.relative_to(ROOT)}:{number}: {line.strip()}"
                 for module in modules
                 for number, line in enumerate(module.read_text().splitlines(), 1)
                 if _LOCAL_FS.search(line) and not line.lstrip().startswith("#")]
    assert offending == []


def test_a_misspelt_storage_option_is_an_error_naming_it_and_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo would otherwise fall back to a default (the default endpoint) silently. (No
    SparkSession: the whole suite's would qualify s3a:// paths through Hadoop, which has no S3A.)"""
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", staticmethod(lambda: None))
    with pytest.raises(StorageOptionError, match=r"`AWS_ENDPONT_URL`.*did you mean `AWS_ENDPOINT_URL`\?.*"
                                                 r"Known options: .*AWS_ALLOW_HTTP.*passthrough\.") as raised:
        resolve("s3a://bucket/t", storage_options={"AWS_ENDPONT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1"})
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, StreamingMergeError)
    assert "AWS_REGION" not in str(raised.value).split("Known options")[0]
    # obstore's own keys, its client options, delta-rs' own, each store's spelling on a local table
    accepted = {"AWS_ENDPOINT_URL": "http://minio:9000", "aws_allow_http": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
                "DELTA_DYNAMO_TABLE_NAME": "locks", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
    assert resolve("s3://bucket/t", storage_options=accepted).options == accepted
    assert resolve("gs://bucket/t", storage_options={"GOOGLE_SERVICE_ACCOUNT": "/k.json"}).options is not None
    with pytest.raises(StorageOptionError, match="GOOGLE_SERVICE_ACOUNT"):
        resolve("gs://bucket/t", storage_options={"GOOGLE_SERVICE_ACOUNT": "/k.json"})
    with pytest.raises(StorageOptionError, match="S3, GCS or Azure"):
        resolve("/lake/t", storage_options={"AWS_REGON": "eu-west-1"})
    # an option only the cluster knows passes under the prefix, without it
    passed = resolve("s3a://bucket/t", storage_options={"passthrough.MY_PROXY_TOKEN": "x"})
    assert passed.options == {"MY_PROXY_TOKEN": "x"}
