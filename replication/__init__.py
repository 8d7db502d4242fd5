"""A reproducible replication workbook for co-evolutionary and multi-agent LLM training."""
__version__ = "0.1.0"
