"""The log plane and file IO: snapshots, scans, Parquet writes and commits of Delta tables.

Only this package talks to ``deltalake`` (delta-rs); everything above it sees our own
types and our own errors.
"""
