"""What the launcher's forkserver imports, once, before it forks any worker (launch/start.py).

Importing this module is meant to have an effect, and only that server imports it:

- the worker's modules (torch and shoal's core), shared by every worker it forks, and
  torch._dynamo: every torch.optim optimizer imports it when the first one is built
  (torch.optim's `_disable_dynamo`), about a second of CPU that each worker would
  otherwise pay again at its first step, although nothing is compiled;
- a death signal tied to the launcher (SIGKILL when its parent, the launcher, dies).
  multiprocessing's server would otherwise end only once it noticed the launcher's end
  of its "alive" pipe close, and then finalize its interpreter (about a second with
  torch loaded) while the workers trained on. Killed at once instead, it makes each
  worker's own death signal (a SIGTERM: stop at the next step, with a checkpoint; see
  worker.py) come as soon as it would for a worker the launcher exec'd itself.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def _die_with_the_launcher() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the server ends when the launcher's end of its pipe closes


# first: `shoal train` starts the server before it has planned the job (cli/main.py), and a
# launcher that ends while the server still imports (a refused job) takes it along
_die_with_the_launcher()

import torch._dynamo  # noqa: E402, F401  (see above: the first optimizer would import it)

import shoal.comm.links  # noqa: E402  (every strategy's worker runs its messages,
import shoal.launch.worker  # noqa: E402  the worker itself,
import shoal.training.driver  # noqa: E402  the driver,
import shoal.training.steps  # noqa: E402, F401  the step loop and the learner)
# (the strategies themselves are found by name: launch/ imports none)
