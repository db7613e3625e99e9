"""A driver with Spark's Prometheus servlet and JmxSink on, for tests/spark/test_spark_metrics.py.

Runs a named streaming query of two MergeSink batches (JSON files → Delta) in its own
``local[1]`` session with the UI on, then prints one JSON object: ``progress`` (the sink's
progress records), ``prometheus`` (every line of ``/metrics/prometheus`` naming the sink's
source) and ``jmx`` (the value of every MBean of the sink's source, by object name), as a
Prometheus server and a JMX client would read them.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from streaming_merge import MergeSink
from streaming_merge.session import local_session
from tests.streaming_support.cdc_events import SCHEMA, write_files

NAMESPACE = "metrics_app"  # spark.metrics.namespace: the names do not carry the app id
QUERY_NAME = "orders-cdc"

METRICS_CONF = {
    "spark.metrics.namespace": NAMESPACE,
    "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
    "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
    "spark.metrics.conf.*.sink.jmx.class": "org.apache.spark.metrics.sink.JmxSink",
    "spark.ui.port": "0",  # any free port: the test reads it from sc.uiWebUrl
}

BATCHES = [
    [{"id": i, "lsn": 1, "op": "c", "name": f"n{i}", "amount": float(i)} for i in range(10)],
    [{"id": i, "lsn": 2, "op": "d" if i < 7 else "u", "name": f"m{i}", "amount": float(i)} for i in range(5, 15)],
]


def jmx_values(spark: Any, source_name: str) -> dict[str, Any]:
    """Every MBean of the source in the driver's platform MBean server: Dropwizard's JmxReporter
    exposes a counter's ``Count`` and a gauge's ``Value``. Called through the ``MBeanServer``
    interface's methods: py4j looks methods up on the object's class, which lives in a package
    the JDK does not export."""
    context = spark.sparkContext
    jvm, gateway = context._jvm, context._gateway

    def method(name: str, *parameter_types: str) -> Any:
        types = gateway.new_array(jvm.java.lang.Class, len(parameter_types))
        for index, type_name in enumerate(parameter_types):
            types[index] = jvm.java.lang.Class.forName(type_name)
        return jvm.java.lang.Class.forName("javax.management.MBeanServer").getMethod(name, types)

    def call(target: Any, found: Any, *arguments: Any) -> Any:
        values = gateway.new_array(jvm.java.lang.Object, len(arguments))
        for index, argument in enumerate(arguments):
            values[index] = argument
        return found.invoke(target, values)

    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    query_names = method("queryNames", "javax.management.ObjectName", "javax.management.QueryExp")
    get_attribute = method("getAttribute", "javax.management.ObjectName", "java.lang.String")
    pattern = jvm.javax.management.ObjectName(f"metrics:name={NAMESPACE}.driver.{source_name}.*,*")
    values: dict[str, Any] = {}
    for name in call(server, query_names, pattern, None):
        attribute = "Count" if name.getKeyProperty("type") == "counters" else "Value"
        values[name.getKeyProperty("name")] = call(server, get_attribute, name, attribute)
    return values


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    spark = local_session("metrics_app", "local[1]", ui=True, shuffle_partitions=1, extra_conf=METRICS_CONF,
                          short_run=True)
    try:
        write_files(str(workdir / "in"), BATCHES)
        sink = MergeSink(str(workdir / "orders"), keys=["id"], sequence_by="lsn", apply_as_deletes="op = 'd'")
        query = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(workdir / "in"))
                 .writeStream.queryName(QUERY_NAME).foreachBatch(sink)
                 .option("checkpointLocation", str(workdir / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination()
        source_name = "streaming_merge." + QUERY_NAME.replace("-", "_")
        url = f"{spark.sparkContext.uiWebUrl}/metrics/prometheus"
        with urllib.request.urlopen(url, timeout=30) as response:
            exposition = response.read().decode()
        prefix = f"metrics_{NAMESPACE}_driver_{source_name.replace('.', '_')}_"
        print(json.dumps({
            "progress": sink.recentProgress,
            "prometheus": [line for line in exposition.splitlines() if line.startswith(prefix)],
            "jmx": jmx_values(spark, source_name),
        }))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
