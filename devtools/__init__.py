"""Servers and artifacts for the tests and benchmarks: jars from Maven Central, Apache Kafka,
Kafka Connect with Debezium, PostgreSQL. Not part of the installed package."""
