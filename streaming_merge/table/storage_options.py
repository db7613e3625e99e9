"""delta-rs storage options derived from the Spark session's Hadoop configuration.

Spark reaches object stores through Hadoop connectors configured with ``fs.s3a.*``,
``fs.azure.*`` or ``fs.gs.*`` / ``google.cloud.*`` keys (usually set as
``spark.hadoop.*``); delta-rs reads the same stores with its own option names. Where the
mapping is known it is applied here, so one configuration serves both planes; options the
user passes explicitly (``storage_options=``) always win. Credentials that Hadoop gets from
a provider chain (instance profiles, workload identity) need no mapping: delta-rs finds
them the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

Getter = Callable[[str], str | None]

# fs.s3a.<suffix> (or its per-bucket form fs.s3a.bucket.<bucket>.<suffix>) -> delta-rs option.
_S3A = {
    "access.key": "AWS_ACCESS_KEY_ID",
    "secret.key": "AWS_SECRET_ACCESS_KEY",
    "session.token": "AWS_SESSION_TOKEN",
    "endpoint.region": "AWS_REGION",
}


def hadoop_getter(spark: SparkSession) -> Getter:
    """Reads single keys of the session's Hadoop configuration (one JVM call per key,
    instead of copying the whole configuration across)."""
    conf = spark._jsc.hadoopConfiguration()

    def get(key: str) -> str | None:
        value = conf.get(key)
        return str(value) if value is not None else None

    return get


def storage_options_for(uri: str, get: Getter) -> dict[str, str]:
    """The delta-rs options for the table at ``uri`` (a Hadoop-qualified URI)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("s3a", "s3", "s3n"):
        return _s3(parts.netloc, get)
    if scheme in ("abfs", "abfss", "wasb", "wasbs"):
        return _azure(parts.netloc, get)
    if scheme == "gs":
        return _gcs(get)
    return {}


def _s3(bucket: str, get: Getter) -> dict[str, str]:
    def s3a(suffix: str) -> str | None:
        return get(f"fs.s3a.bucket.{bucket}.{suffix}") or get(f"fs.s3a.{suffix}")

    options = {option: value for suffix, option in _S3A.items() if (value := s3a(suffix))}
    ssl = (s3a("connection.ssl.enabled") or "true").lower() != "false"
    endpoint = s3a("endpoint")
    if endpoint:
        if "://" not in endpoint:
            endpoint = ("https://" if ssl else "http://") + endpoint
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if (s3a("path.style.access") or "").lower() == "true":
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    return options


def _azure(netloc: str, get: Getter) -> dict[str, str]:
    host = netloc.rsplit("@", 1)[-1]  # container@account.dfs.core.windows.net
    account = host.split(".", 1)[0]
    options = {"AZURE_STORAGE_ACCOUNT_NAME": account} if account else {}
    key = get(f"fs.azure.account.key.{host}")
    if key:
        options["AZURE_STORAGE_ACCOUNT_KEY"] = key
    sas = get(f"fs.azure.sas.fixed.token.{host}")
    if sas:
        options["AZURE_STORAGE_SAS_KEY"] = sas
    client_id = get(f"fs.azure.account.oauth2.client.id.{host}") or get("fs.azure.account.oauth2.client.id")
    secret = get(f"fs.azure.account.oauth2.client.secret.{host}") or get("fs.azure.account.oauth2.client.secret")
    endpoint = (get(f"fs.azure.account.oauth2.client.endpoint.{host}")
                or get("fs.azure.account.oauth2.client.endpoint"))
    if client_id and secret:
        options["AZURE_CLIENT_ID"] = client_id
        options["AZURE_CLIENT_SECRET"] = secret
        tenant = _azure_tenant(endpoint)
        if tenant:
            options["AZURE_TENANT_ID"] = tenant
    return options


def _azure_tenant(endpoint: str | None) -> str | None:
    """``https://login.microsoftonline.com/<tenant>/oauth2/token`` -> ``<tenant>``."""
    if not endpoint:
        return None
    segments = [s for s in urlsplit(endpoint).path.split("/") if s]
    return segments[0] if segments else None


def _gcs(get: Getter) -> dict[str, str]:
    keyfile = (get("fs.gs.auth.service.account.json.keyfile")
               or get("google.cloud.auth.service.account.json.keyfile"))
    return {"GOOGLE_SERVICE_ACCOUNT": keyfile} if keyfile else {}
