"""`population_based`: population-based training (Jaderberg et al., 2017, arXiv:1711.09846).

A population of members, each a model with its own hyperparameters, trains in
generations of `ready_interval` steps. Between generations the worst members
*exploit* the best (copy their weights and optimizer state) and *explore*
(perturb or resample the copied hyperparameters). The members time-share the
worker processes; copies between workers travel as tensors.
"""
