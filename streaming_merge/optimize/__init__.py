"""Compaction of small files (OPTIMIZE) and its opt-in use after streaming MERGE batches."""
