"""Recovering instead of stopping: automatic restarts (`restarts.py`) and the live status of a
job's ranks (`status.py`, `shoal status RUN_DIR`)."""
