"""Explicit storage options, checked: a misspelt one is an error, not a silent default.

Why: an option nobody knows (``AWS_ENDPONT_URL``) would otherwise be dropped on the way to the
object store, and the table read from the default endpoint instead. A key is known when
obstore's store for the table's scheme takes it (obstore itself decides, by building a store,
which touches no network), when it is one of obstore's HTTP client options, or when it is
one of delta-rs' own (its locking and rename-safety options, which obstore does not take).
An option only some other part of a cluster knows passes unchecked under the prefix
``passthrough.``: ``passthrough.MY_KEY`` reaches delta-rs and obstore as ``MY_KEY``.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.resources
from collections.abc import Mapping
from urllib.parse import urlsplit

from streaming_merge.errors import StorageOptionError

__all__ = ["PASS_THROUGH_PREFIX", "checked_storage_options"]

PASS_THROUGH_PREFIX = "passthrough."

# obstore's names for Hadoop's schemes, and a bucket URL of each to build a probe store with.
_PROBES = {"s3": "s3://probe", "s3a": "s3://probe", "s3n": "s3://probe", "gs": "gs://probe",
           "abfs": "az://probe", "abfss": "az://probe", "az": "az://probe", "adl": "az://probe",
           "azure": "az://probe", "wasb": "az://probe", "wasbs": "az://probe"}
# obstore's typed config per store: (stub file, class, the prefix its keys take in delta-rs spelling).
_LOCAL_PROBES = ("s3://probe", "gs://probe", "az://probe")
_STUBS = {"s3": ("_aws.pyi", "S3Config", "AWS_"), "gs": ("_gcs.pyi", "GCSConfig", "GOOGLE_"),
          "az": ("_azure.pyi", "AzureConfig", "AZURE_")}
# delta-rs' own S3 options (deltalake-aws' constants): locking, rename safety, its credential chain.
_DELTA_RS_S3 = frozenset({
    "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION_DYNAMODB", "AWS_ACCESS_KEY_ID_DYNAMODB",
    "AWS_SECRET_ACCESS_KEY_DYNAMODB", "AWS_SESSION_TOKEN_DYNAMODB", "AWS_PROFILE", "AWS_S3_ADDRESSING_STYLE",
    "AWS_S3_LOCKING_PROVIDER", "AWS_IAM_ROLE_ARN", "AWS_S3_ASSUME_ROLE_ARN", "AWS_IAM_ROLE_SESSION_NAME",
    "AWS_S3_ROLE_SESSION_NAME", "AWS_S3_POOL_IDLE_TIMEOUT_SECONDS", "AWS_STS_POOL_IDLE_TIMEOUT_SECONDS",
    "AWS_S3_GET_INTERNAL_SERVER_ERROR_RETRIES", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME", "AWS_ALLOW_HTTP", "AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_TIMEOUT", "AWS_FORCE_CREDENTIAL_LOAD", "DELTA_DYNAMO_TABLE_NAME",
    "DELTA_DYNAMO_BILLING_MODE", "DELTA_DYNAMO_MAX_ELAPSED_REQUEST_TIME",
})


def checked_storage_options(uri: str, options: Mapping[str, str]) -> dict[str, str]:
    """``options`` for the table at ``uri`` with the pass-through prefix taken off; raises
    :class:`StorageOptionError` naming every unknown key, with the known ones."""
    probe = _probe_url(uri)
    # A local table uses none, but the same options often serve a local run and a cluster's
    # object store: spelt as one of the stores spells them, they pass.
    probes = _LOCAL_PROBES if probe is None else (probe,)
    unknown = [key for key in options
               if not key.startswith(PASS_THROUGH_PREFIX) and not any(_known(p, key) for p in probes)]
    if unknown:
        raise StorageOptionError(_message(uri, probe, unknown))
    return {key.removeprefix(PASS_THROUGH_PREFIX): value for key, value in options.items()}


def _probe_url(uri: str) -> str | None:
    """The probe store's URL for the table's scheme; None for a local table."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in ("", "file") or len(scheme) == 1:
        return None
    return _PROBES.get(scheme, f"{scheme}://probe")


@functools.lru_cache(maxsize=512)
def _known(probe: str, key: str) -> bool:
    from obstore.exceptions import UnknownConfigurationKeyError
    from obstore.store import from_url

    from streaming_merge.table.store import client_option_name

    if client_option_name(key) is not None or (probe.startswith("s3:") and key.upper() in _DELTA_RS_S3):
        return True
    try:
        from_url(probe, config={key: "1"})  # type: ignore  # obstore types its configs as TypedDicts of known keys
    except UnknownConfigurationKeyError:
        return False
    except BaseException:  # a known key whose probe value does not parse (obstore may panic)
        return True
    return True


def _message(uri: str, probe: str | None, unknown: list[str]) -> str:
    names = ", ".join(f"`{key}`" for key in unknown)
    known = sorted({name for p in (_LOCAL_PROBES if probe is None else (probe,)) for name in _known_names(p)})
    hints = [f"`{key}`: did you mean `{match[0]}`?" for key in unknown
             if (match := difflib.get_close_matches(key.upper(), known, n=1))]
    listed = f" Known options: {', '.join(known)}." if known else ""
    stores = "S3, GCS or Azure" if probe is None else probe.split(":")[0]
    return (f"Unknown storage option {names} for table `{uri}` (not an option of obstore's store for "
            f"{stores}, of its HTTP client, or of delta-rs). {' '.join(hints)}{listed} Prefix an "
            f"option with `{PASS_THROUGH_PREFIX}` to pass it on unchecked.").replace("  ", " ")


@functools.lru_cache(maxsize=8)
def _known_names(probe: str) -> list[str]:
    """obstore's documented config keys for the scheme (from its type stubs, upper-cased), and
    delta-rs' own for S3: for the error message only, so a missing stub just lists fewer."""
    names = set(_DELTA_RS_S3) if probe.startswith("s3:") else set()
    stub = _STUBS.get(probe.split(":")[0])
    if stub is not None:
        try:
            tree = ast.parse(importlib.resources.files("obstore").joinpath("_store", stub[0]).read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name == stub[1]:
                    fields = {item.target.id.upper() for item in node.body
                              if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
                    names |= {name if name.startswith(stub[2]) else stub[2] + name for name in fields}
        except (OSError, SyntaxError, ModuleNotFoundError):
            pass
    return sorted(names)
