"""`data_parallel`: replicas, a data shard each, gradients summed every step.

`config.py` is the `[strategy]` section (its `[strategy.aggregation]` methods are
the aggregator plugins, see `shoal plugins`); `strategy.py` attaches the gradient sync.
"""
