"""The shared training loop: batching, optimizer and schedule, steps, evaluation, checkpoints."""
