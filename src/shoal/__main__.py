"""`python -m shoal` (and so `torchrun -m shoal train job.toml`)."""

import sys

from shoal.cli.main import main

sys.exit(main())
