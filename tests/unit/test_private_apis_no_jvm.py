"""The private PySpark state ``session.stop_session`` relies on, read from PySpark's own code
(no JVM): an upgrade that renames it would make ``stop_session`` a plain, slower stop without
a word. See bench/private_apis.md."""

from __future__ import annotations

import inspect

from pyspark import accumulators
from pyspark.core.context import SparkContext


def test_the_spark_context_keeps_its_accumulator_server_where_stop_session_looks() -> None:
    started = inspect.getsource(SparkContext._do_init)
    stopped = inspect.getsource(SparkContext.stop)
    assert "self._accumulatorServer = start_update_server(" in started
    assert "self._accumulatorServer.shutdown()" in stopped, "SparkContext.stop no longer waits on the server"


def test_the_accumulator_servers_handler_polls_the_flag_stop_session_sets() -> None:
    handler = inspect.getsource(accumulators.UpdateRequestHandler)
    assert "while not self.server.server_shutdown:" in handler
    # local_session's JVM talks to Python over a Unix domain socket, others over TCP.
    for server in (accumulators.AccumulatorTCPServer, accumulators.AccumulatorUnixServer):
        assert server.server_shutdown is False
        assert callable(server.server_close)
