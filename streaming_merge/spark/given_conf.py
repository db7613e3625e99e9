"""The Spark settings a user made explicitly, outside the code that starts a session: the
``spark-defaults.conf`` of ``$SPARK_CONF_DIR`` (else ``$SPARK_HOME/conf``) and the ``--conf``
pairs of ``PYSPARK_SUBMIT_ARGS``. A default of this package never replaces one of them."""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from streaming_merge.spark.class_archive import spark_home

DEFAULTS_FILE = "spark-defaults.conf"
SUBMIT_ARGS_ENV = "PYSPARK_SUBMIT_ARGS"
# spark-submit flags that are settings under another name.
_SUBMIT_FLAG_SETTINGS = {"--driver-memory": "spark.driver.memory", "--driver-java-options":
                         "spark.driver.extraJavaOptions", "--name": "spark.app.name", "--master": "spark.master"}


def conf_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where Spark's launcher reads ``spark-defaults.conf`` and ``log4j2.properties``."""
    env = os.environ if environ is None else environ
    return Path(env["SPARK_CONF_DIR"]) if env.get("SPARK_CONF_DIR") else spark_home(env) / "conf"


def defaults_file_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of ``spark-defaults.conf``, parsed as Spark's launcher parses it: one
    ``key value`` (or ``key=value``) a line, ``#`` comments; no file, no settings."""
    try:
        lines = (conf_folder(environ) / DEFAULTS_FILE).read_text().splitlines()
    except OSError:
        return {}
    settings = {}
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        cut = min((i for i in (text.find(" "), text.find("\t"), text.find("=")) if i > 0), default=len(text))
        key, value = text[:cut], text[cut:].lstrip(" \t=").strip()
        if key:
            settings[key] = value
    return settings


def submit_args_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings given in ``PYSPARK_SUBMIT_ARGS`` (``--conf k=v`` and the flags that are
    settings, such as ``--driver-memory``), which PySpark passes to the JVM it starts."""
    env = os.environ if environ is None else environ
    try:
        words = shlex.split(env.get(SUBMIT_ARGS_ENV, ""))
    except ValueError:  # unbalanced quotes: spark-submit itself reports them
        return {}
    settings = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--conf" and "=" in value:
            key, _, setting = value.partition("=")
            settings[key.strip()] = setting
        elif flag in _SUBMIT_FLAG_SETTINGS:
            settings[_SUBMIT_FLAG_SETTINGS[flag]] = value
    return settings


def given_settings(code_conf: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every explicit setting, the later source winning as in Spark: ``spark-defaults.conf``,
    then ``PYSPARK_SUBMIT_ARGS``, then the caller's own (``code_conf``)."""
    return {**defaults_file_settings(environ), **submit_args_settings(environ), **code_conf}
