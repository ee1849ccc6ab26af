"""Workloads: what is trained (model, data, loss, evaluation)."""
