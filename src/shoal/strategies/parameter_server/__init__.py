"""`parameter_server`: embedding tables sharded over server processes, rows pulled and pushed.

Not to be confused with `comm/server_allreduce.py` (`[strategy.aggregation] method =
"parameter_server"`), a *gradient aggregation method*
of `data_parallel` (dense buckets summed through one rank). Here the servers own
the parameters: workers hold only the rows a batch touches.

One file per concern: `config.py` (the `[strategy]` section), `sharding.py`
(which server owns a row), `wire.py` (the tensor-only message format),
`row_optimizers.py` (SGD, row-wise Adagrad, lazy Adam on rows), `server.py` (a
shard's tables, clocks, held pulls and refusals), `endpoint.py` (the server's
receive loop: reading each sender's messages in step, and replies),
`transport.py` (a worker's requests to one server, over torch.distributed or
in-process), `client.py` (a worker's view of all shards), `shards.py` (checkpoint
files of a shard, re-sharding on resume), `learner.py` (a worker's step with
prefetch), `trainer.py` (the shared training loop around it) and `strategy.py`
(roles and placement).
"""
