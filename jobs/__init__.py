"""Runnable jobs built on streaming_merge (the only place that configures logging)."""
