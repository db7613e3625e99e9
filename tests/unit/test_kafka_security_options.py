"""The translation table of Kafka's security options (Spark's connector's names) for the two
Python clients of the ``kafka_py`` source, and the job's ``--kafka-option`` checks. No broker, no
JVM: the truststore conversion itself is tested on the test broker's stores
(tests/kafka/test_sasl_ssl.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobs._common import checked_kafka_options
from jobs.kafka_cdc_ingest import parse_args, session_packages
from streaming_merge.kafka._clients.common import translate_options
from streaming_merge.kafka._clients.truststore import Truststore
from streaming_merge.kafka.source import KafkaOptions, KafkaSourceError

PLAIN = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
SCRAM = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'


# ------------------------------------------------------------------------------ the table


@pytest.mark.parametrize(("given", "confluent", "kafka_python"), [
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN},
     {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
     {"sasl_mechanism": "PLAIN", "sasl_plain_username": "u", "sasl_plain_password": "p"}),
    ({"sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": SCRAM},
     {"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "u", "sasl.password": "p"},
     {"sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "u", "sasl_plain_password": "p"}),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem"},
     {"ssl.ca.location": Truststore("/ca.pem", "PEM")}, {"ssl_cafile": Truststore("/ca.pem", "PEM")}),
    ({"ssl.truststore.location": "/t.jks", "ssl.truststore.password": "pw"},  # Kafka's default type: JKS
     {"ssl.ca.location": Truststore("/t.jks", "JKS", "pw")}, {"ssl_cafile": Truststore("/t.jks", "JKS", "pw")}),
    ({"ssl.truststore.type": "pkcs12", "ssl.truststore.location": "/t.p12"},
     {"ssl.ca.location": Truststore("/t.p12", "PKCS12")}, {"ssl_cafile": Truststore("/t.p12", "PKCS12")}),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/k.p12", "ssl.keystore.password": "pw"},
     {"ssl.keystore.location": "/k.p12", "ssl.keystore.password": "pw"}, None),
], ids=["jaas-plain", "jaas-scram", "truststore-pem", "truststore-jks", "truststore-pkcs12", "keystore-pkcs12"])
def test_translation_table(given: dict[str, str], confluent: dict[str, Any], kafka_python: dict[str, Any] | None
                           ) -> None:
    assert dict(translate_options("confluent", given)) == confluent
    if kafka_python is None:
        with pytest.raises(KafkaSourceError, match="cannot be translated for kafka-python"):
            translate_options("kafka-python", given)
    else:
        assert dict(translate_options("kafka-python", given)) == kafka_python


@pytest.mark.parametrize(("given", "message"), [
    ({"sasl.mechanism": "KERBEROS"}, "Option 'kafka.sasl.mechanism' must be one of PLAIN, SCRAM-SHA-256"),
    ({"sasl.jaas.config": PLAIN}, "uses PlainLoginModule: set kafka.sasl.mechanism to PLAIN (got None; Kafka's "
                                  "default is GSSAPI)"),
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM}, "set kafka.sasl.mechanism to SCRAM-SHA-256 or "
                                                             "SCRAM-SHA-512 (got 'PLAIN'"),
    ({"sasl.mechanism": "GSSAPI", "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required "
                                                      'useKeyTab=true keyTab="/k" principal="p";'},
     "Option 'kafka.sasl.jaas.config' can only be translated for PlainLoginModule or ScramLoginModule"),
    ({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer."
                                                           "OAuthBearerLoginModule required;"},
     "Option 'kafka.sasl.jaas.config' can only be translated"),
    ({"ssl.truststore.type": "BKS", "ssl.truststore.location": "/t"},
     "Option 'kafka.ssl.truststore.type' must be one of JKS, PKCS12, PEM, got 'BKS'"),
    ({"ssl.truststore.password": "pw"}, "needs 'kafka.ssl.truststore.location'"),
    ({"ssl.truststore.location": "/t.jks", "ssl.ca.location": "/ca.pem"},
     "Set one of 'kafka.ssl.truststore.location' and 'kafka.ssl.ca.location'"),
    ({"ssl.keystore.location": "/k.jks"}, "Option 'kafka.ssl.keystore.type' cannot be translated for confluent"),
])
@pytest.mark.parametrize("kind", ["confluent", "kafka-python"])
def test_what_cannot_be_translated_is_an_error_naming_the_option(kind: str, given: dict[str, str],
                                                                  message: str) -> None:
    if kind == "kafka-python" and "keystore" in str(given):
        message = "Option 'kafka.ssl.keystore.location' cannot be translated for kafka-python"
    if kind == "kafka-python" and given.get("sasl.mechanism") == "OAUTHBEARER":
        message = "Option 'kafka.sasl.mechanism=OAUTHBEARER' cannot be translated for kafka-python"
    with pytest.raises(KafkaSourceError) as failure:
        translate_options(kind, given)
    assert message in str(failure.value)


def test_oauthbearer_needs_an_object_in_kafka_python() -> None:
    with pytest.raises(KafkaSourceError, match=re.escape("OAUTHBEARER' cannot be translated for kafka-python")):
        translate_options("kafka-python", {"sasl.mechanism": "OAUTHBEARER"})
    assert dict(translate_options("confluent", {"sasl.mechanism": "OAUTHBEARER"})) == {
        "sasl.mechanism": "OAUTHBEARER"}  # librdkafka's own sasl.oauthbearer.* options configure it


def test_the_api_timeout_bounds_the_drivers_metadata_calls() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    options = KafkaOptions.parse({**base, "kafka.default.api.timeout.ms": "2500"})
    assert options.client.metadata_timeout_s == 2.5
    assert "default.api.timeout.ms" not in dict(options.client.settings), "no client takes the Java name"
    with pytest.raises(KafkaSourceError, match=re.escape("kafka.default.api.timeout.ms must be a positive integer")):
        KafkaOptions.parse({**base, "kafka.default.api.timeout.ms": "soon"})


# ------------------------------------------------------------------------------ the job's --kafka-option


JOB = ["--bootstrap-servers", "h:1", "--topics", "t", "--target", "/tmp/t", "--keys", "id", "--checkpoint", "/tmp/c"]


def test_kafka_options_reach_both_job_modes() -> None:
    config, _, spark_conf = parse_args([*JOB, "--kafka-option", "kafka.security.protocol=SASL_SSL",
                                        "--kafka-option", "kafka.sasl.jaas.config=a=b"])
    assert config.kafka_options == {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.jaas.config": "a=b"}
    assert "spark.jars.packages" not in spark_conf
    database, _, spark_conf = parse_args(["--bootstrap-servers", "h:1", "--subscribe-pattern", "db\\..*",
                                          "--target-root", "/tmp/r", "--checkpoint", "/tmp/c", "--source-format",
                                          "kafka", "--kafka-option", "kafka.security.protocol=SSL"])
    assert database.kafka_options == {"kafka.security.protocol": "SSL"} and database.source_format == "kafka"
    assert session_packages(database, spark_conf) == ("kafka",), "the connector joins a session the job creates"
    assert session_packages(database, {"spark.jars.packages": "mine"}) == ()


@pytest.mark.parametrize(("argv", "message"), [
    (["--kafka-option", "security.protocol=SSL"], "must be named kafka.<client setting>"),
    (["--kafka-option", "kafka.security.protocol"], "--kafka-option expects KEY=VALUE"),
    (["--kafka-option", "kafka.bootstrap.servers=x:1"], "give the bootstrap servers with --bootstrap-servers"),
    (["--source-format", "kafka", "--kafka-option", "kafka.client=confluent"],
     "'kafka.client' chooses the Python client of the kafka_py source"),
    (["--source-format", "spark"], "invalid choice: 'spark'"),
])
def test_bad_kafka_options_are_argparse_errors(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([*JOB, *argv])
    assert message in capsys.readouterr().err


def test_library_configs_are_checked_too() -> None:
    assert checked_kafka_options({"kafka.client": "confluent"}, "kafka_py") == {"kafka.client": "confluent"}
    with pytest.raises(ValueError, match="source format must be one of kafka_py, kafka"):
        checked_kafka_options({}, "kafka2")
