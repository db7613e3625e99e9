"""Java truststores as the PEM CA file both Python clients take (librdkafka ``ssl.ca.location``,
kafka-python ``ssl_cafile``).

Spark's connector (the Java client) reads ``kafka.ssl.truststore.location`` as JKS, PKCS12 or
PEM; librdkafka and kafka-python read PEM only. A JKS or PKCS12 store is converted by the JDK's
``keytool -list -rfc`` (every Spark host has a JDK; no Python package reads JKS, and
``cryptography`` is not a dependency). The conversion happens where a consumer is built (the
driver and each executor, whose store may be a local copy), once per store file: the PEM is kept
in a per-user temporary folder under a name derived from the store's path, size, mtime, type and
password, so the Python workers of one host share it and a changed store is converted again."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streaming_merge.kafka._clients.common import KafkaSourceError

TYPES = ("JKS", "PKCS12", "PEM")
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.S)
_KEYTOOL_TIMEOUT_S = 60.0
_LOCK = threading.Lock()
_CONVERTED: dict[tuple[Any, ...], str] = {}


@dataclass(frozen=True)
class Truststore:
    """``kafka.ssl.truststore.*`` as given; :meth:`pem_file` is the CA file the clients read.
    A setting value of the translated options (hashable, picklable: it travels to the executors)."""

    location: str | None = None
    type: str = "JKS"  # Kafka's default ssl.truststore.type
    password: str | None = field(default=None, repr=False)
    certificates: str | None = field(default=None, repr=False)  # ssl.truststore.certificates (PEM text)

    def pem_file(self) -> str:
        if self.certificates is not None:
            return _cached(self.certificates.encode(), ("certificates", self.certificates), ".pem")
        assert self.location is not None
        if self.type == "PEM":
            return self.location
        path = Path(self.location)
        try:
            stat = path.stat()
        except OSError as exc:
            raise KafkaSourceError(f"Option 'kafka.ssl.truststore.location': cannot read {self.location!r}: "
                                   f"{exc.strerror}.") from exc
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, self.type, self.password or "")
        return _cached_from(key, lambda: _keytool_export(path, self.type, self.password))


def parse_truststore(options: dict[str, str]) -> Truststore | None:
    """The ``ssl.truststore.*`` options (prefix ``kafka.`` removed, names lower case), taken out
    of ``options``; None when there are none."""
    location = options.pop("ssl.truststore.location", None)
    kind = options.pop("ssl.truststore.type", None)
    password = options.pop("ssl.truststore.password", None)
    certificates = options.pop("ssl.truststore.certificates", None)
    if location is None and certificates is None:
        if kind is not None or password is not None:
            raise KafkaSourceError("Option 'kafka.ssl.truststore.type'/'.password' needs "
                                   "'kafka.ssl.truststore.location' (or 'kafka.ssl.truststore.certificates').")
        return None
    normal = (kind or ("PEM" if certificates is not None else "JKS")).strip().upper()
    if normal not in TYPES:
        raise KafkaSourceError(f"Option 'kafka.ssl.truststore.type' must be one of {', '.join(TYPES)}, got {kind!r}.")
    if location is not None and certificates is not None:
        raise KafkaSourceError("Set one of 'kafka.ssl.truststore.location' and 'kafka.ssl.truststore.certificates'.")
    if certificates is not None and normal != "PEM":
        raise KafkaSourceError("Option 'kafka.ssl.truststore.certificates' needs kafka.ssl.truststore.type=PEM.")
    return Truststore(location=location, type=normal, password=password, certificates=certificates)


def resolved(settings: dict[str, Any]) -> dict[str, Any]:
    """Client settings with every :class:`Truststore` value replaced by its PEM file's path."""
    return {k: v.pem_file() if isinstance(v, Truststore) else v for k, v in settings.items()}


def _folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"streaming_merge-truststores-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _name(key: tuple[Any, ...], suffix: str = ".pem") -> Path:
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return _folder() / f"{digest}{suffix}"


def _write(target: Path, data: bytes) -> None:
    """Atomically: a worker reading the file never sees half of it."""
    handle, partial = tempfile.mkstemp(dir=target.parent, prefix=".partial-")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(partial, target)


def _cached(data: bytes, key: tuple[Any, ...], suffix: str) -> str:
    target = _name(key, suffix)
    if not target.exists():
        _write(target, data)
    return str(target)


def _cached_from(key: tuple[Any, ...], convert: Callable[[], bytes]) -> str:
    """The PEM file of ``key``, converted by ``convert`` if no worker of this host did it yet.
    Remembered per process too: a consumer then costs one stat, not a file check."""
    with _LOCK:
        known = _CONVERTED.get(key)
        if known is not None and Path(known).exists():
            return known
        target = _name(key)
        if not target.exists():
            _write(target, convert())
        _CONVERTED[key] = str(target)
        return str(target)


def keytool() -> str | None:
    """The JDK's keytool: $JAVA_HOME/bin, the PATH, or beside the ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "keytool").exists():
        return str(Path(home) / "bin" / "keytool")
    found = shutil.which("keytool")
    if found:
        return found
    java = shutil.which("java")
    if java and (Path(java).resolve().parent / "keytool").exists():
        return str(Path(java).resolve().parent / "keytool")
    return None


def _keytool_export(path: Path, kind: str, password: str | None) -> bytes:
    """Every certificate of the store as PEM."""
    tool = keytool()
    if tool is None:
        raise KafkaSourceError(
            f"Option 'kafka.ssl.truststore.location' ({kind} store {str(path)!r}) needs the JDK's keytool to be "
            "converted for the Python Kafka clients, and none was found (JAVA_HOME, PATH); give the CA as a PEM "
            "file instead (kafka.ssl.truststore.type=PEM).")
    command = [tool, "-list", "-rfc", "-keystore", str(path), "-storetype", kind]
    environment = dict(os.environ)
    if password is not None:
        environment["STREAMING_MERGE_TRUSTSTORE_PASSWORD"] = password  # not on the command line (ps)
        command += ["-storepass:env", "STREAMING_MERGE_TRUSTSTORE_PASSWORD"]
    result = subprocess.run(command, input=b"\n", capture_output=True, env=environment, check=False,
                            timeout=_KEYTOOL_TIMEOUT_S)
    certificates = _PEM_BLOCK.findall(result.stdout)
    if result.returncode != 0 or not certificates:
        detail = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
        reason = detail[-1] if detail else f"keytool exited with {result.returncode}"
        if result.returncode == 0:
            reason = "it holds no certificate"
        raise KafkaSourceError(f"Option 'kafka.ssl.truststore.location': cannot read {kind} store {str(path)!r} "
                               f"(check kafka.ssl.truststore.type and kafka.ssl.truststore.password): {reason}")
    return b"\n".join(certificates) + b"\n"
