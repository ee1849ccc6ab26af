"""Strategies that split one model over ranks running the same program (SPMD).

`tensor_parallel` (Megatron: heads and MLP columns/rows over `degree` ranks),
`fully_sharded` (ZeRO-3: parameters, gradients and optimizer state sharded over
the ranks, per block) and `hybrid` (a mesh of data x tensor dimensions) are one
mechanism with three configs: `config.py`; `layout.py` applies torch's own
machinery (DeviceMesh, `parallelize_module`, `fully_shard`) to the lm task's
model; `sync.py` is their gradient sync (a replicated data dimension's per-block
all-reduce, non-finite checks naming rank and mesh coordinates); `strategy.py`
runs the step loop with each rank's data share. Checkpoints go through
torch.distributed.checkpoint (`checkpoint/sharded.py`).
"""
