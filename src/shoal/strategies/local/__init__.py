"""`local`: one process trains on the whole dataset (`config.py`, `strategy.py`)."""
