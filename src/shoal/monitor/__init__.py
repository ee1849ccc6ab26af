"""What a run reports: per-rank logs, metrics.jsonl, progress on the terminal, a summary."""
