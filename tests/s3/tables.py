"""Reading the tier's tables back without Spark: delta-rs for the rows, obstore straight to
moto for the objects and the commit files."""

from __future__ import annotations

import json
from typing import Any

import obstore
from deltalake import DeltaTable as RsTable
from obstore.store import S3Store

from devtools.s3_server import ACCESS_KEY, REGION, SECRET_KEY


def rs_rows(uri: str, options: dict[str, str]) -> list[list[Any]]:
    """The table's (id, v) rows as delta-rs reads them (``s3://``: its own spelling)."""
    table = RsTable(uri.replace("s3a://", "s3://", 1), storage_options=options).to_pyarrow_table(columns=["id", "v"])
    return sorted([row["id"], row["v"]] for row in table.to_pylist())


def table_objects(uri: str, endpoint: str) -> tuple[S3Store, list[str]]:
    """An obstore store on the table's folder (straight to the server at ``endpoint``) and
    every key under it (relative to the table)."""
    bucket, prefix = uri.removeprefix("s3a://").split("/", 1)
    store = S3Store(bucket, prefix=prefix, endpoint=endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                    region=REGION, virtual_hosted_style_request=False, client_options={"allow_http": True})
    keys = sorted(str(meta["path"]) for batch in obstore.list(store) for meta in batch)
    return store, keys


def commits(store: S3Store, keys: list[str]) -> dict[int, list[dict[str, Any]]]:
    """Each commit file's actions, by version."""
    found = {}
    for key in keys:
        name = key.removeprefix("_delta_log/")
        if key.startswith("_delta_log/") and name.endswith(".json") and name[:-5].isdigit():
            text = bytes(obstore.get(store, key).bytes()).decode()
            found[int(name[:-5])] = [json.loads(line) for line in text.splitlines() if line.strip()]
    return found


def txns(actions: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a]
