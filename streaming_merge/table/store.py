"""The table's files as objects, for what the driver itself writes and reads: commit files,
deletion-vector files, and the log entries delta-rs does not expose.

obstore speaks to local disks, S3, GCS and Azure with one API and does put-if-absent on each
(``mode="create"``: an atomic link on a local disk, a conditional put on object stores), which
is exactly what a Delta commit needs. Data files still go through Spark's Hadoop FileSystem.
The store gets the options delta-rs gets, translated where obstore spells them differently.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, UnknownConfigurationKeyError
from obstore.store import LocalStore, from_url

from streaming_merge.errors import DeltaTableError

# obstore raises the builtin FileNotFoundError for a missing object (its NotFoundError class
# exists but is not what get / delete raise); catch both.
NOT_FOUND = (NotFoundError, FileNotFoundError)

# Hadoop's scheme names for stores obstore knows under another name.
_SCHEMES = {"s3a": "s3", "s3n": "s3", "wasb": "abfs", "wasbs": "abfss"}
# obstore's HTTP client options. delta-rs takes them among the storage options, often with a
# store prefix (AWS_ALLOW_HTTP); obstore wants them apart, and panics on them as store config.
_CLIENT_KEYS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "default_headers",
    "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle",
    "http2_only", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate",
    "proxy_excludes", "root_certificate", "randomize_addresses", "read_timeout", "timeout", "user_agent",
})
_STORE_PREFIX = re.compile(r"^(aws_|azure_|google_)")
_UNKNOWN_KEY = re.compile(r"Configuration key: '([^']+)' is not valid")
_store_lock = threading.Lock()


def table_store(table_url: str, storage_options: Mapping[str, str] | None) -> Any:
    """The obstore store rooted at ``table_url`` (``file:///abs/path``, a plain local path,
    ``s3://``/``s3a://``, ``gs://``, ``abfss://``...), one per table and options (cached)."""
    key = (table_url.rstrip("/"), tuple(sorted((storage_options or {}).items())))
    with _store_lock:
        return _cached_store(*key)


@functools.lru_cache(maxsize=64)
def _cached_store(url: str, options: tuple[tuple[str, str], ...]) -> Any:
    try:
        return _build_store(url, dict(options))
    except BaseException as exc:
        # obstore's Rust panics surface as pyo3's PanicException, a BaseException.
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise DeltaTableError(f"Cannot open the storage of table `{url}`: {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    """An exception's message for our own: obstore appends a multi-line debug dump."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def client_option_name(name: str) -> str | None:
    """obstore's HTTP client option a storage option names (``AWS_ALLOW_HTTP`` -> ``allow_http``)."""
    base = _STORE_PREFIX.sub("", name.lower())
    return base if base in _CLIENT_KEYS else None


def _local_path(url: str) -> str | None:
    """The local path of a ``file:`` URL or of a plain path; None for other schemes."""
    parts = urlsplit(url)
    if parts.scheme.lower() == "file":
        return unquote(parts.path)
    if len(parts.scheme) <= 1:  # no scheme, or a Windows drive letter
        return url
    return None


def _build_store(url: str, options: dict[str, str]) -> Any:
    local = _local_path(url)
    if local is not None:
        return LocalStore(local)
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme.lower(), parts.scheme.lower())
    url = urlunsplit((scheme, parts.netloc, parts.path, "", ""))
    client: dict[str, str] = {}
    config: dict[str, str] = {}
    for name, value in options.items():
        base = client_option_name(name)
        if base is not None:
            client[base] = value
        else:
            config[name] = value
    # delta-rs also takes options of its own (locking providers, rename safety...); obstore
    # refuses those, one at a time, and they mean nothing for reading and writing objects.
    while True:
        try:
            # obstore's typed configs are TypedDicts of its known keys; ours are checked by it at run time.
            return from_url(url, config=config or None, client_options=client or None)  # type: ignore

        except UnknownConfigurationKeyError as exc:
            match = _UNKNOWN_KEY.search(str(exc))
            unknown = [k for k in config if match and k.lower() == match.group(1)]
            if not unknown:
                raise
            del config[unknown[0]]




def put_if_absent(store: Any, path: str, data: bytes) -> bool:
    """Write ``path`` unless it exists; False when another writer created it first."""
    try:
        obstore.put(store, path, data, mode="create")
    except AlreadyExistsError:
        return False
    return True


def get_bytes(store: Any, path: str) -> bytes:
    """The whole object at ``path``."""
    return bytes(obstore.get(store, path).bytes())
