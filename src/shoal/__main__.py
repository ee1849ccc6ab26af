"""`python -m shoal` (and so `torchrun -m shoal train job.toml`)."""

from shoal.cli.main import entry

entry()
