"""Kafka CDC ingestion: a Spark streaming source on kafka-python and Debezium decoding.

The only package that imports kafka-python.
"""
