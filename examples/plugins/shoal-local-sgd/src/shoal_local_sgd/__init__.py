"""Local SGD with periodic model averaging, as a shoal strategy plugin (an example).

`config.py` is its `[strategy]` table, `averaging.py` the gradient sync that
averages the replicas every k steps, `strategy.py` the strategy shoal finds
through the `shoal.strategies` entry point in pyproject.toml.
"""
