"""`pipeline`: the model's blocks cut into stages across ranks; micro-batches flow through them.

`config.py` is the `[strategy]` section and its rules; `partition.py` the exact
balanced split of measured block costs, `profile.py` the measurement;
`stages.py` builds torch.distributed.pipelining stages and schedules for one
pipeline dimension over a process group given to it (the strategy's world, or
a hybrid mesh's pipeline dimension); `learner.py` is a rank's learner (its
stages under the schedule, global-norm clipping, checkpoint parts in `local`'s
layout, the full model as model of record); `measure.py` times compute and idle
per rank; `strategy.py` puts them together on the step loop.
"""
