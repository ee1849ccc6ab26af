"""How the local launcher starts a worker process: forked from a warm server, or exec'd.

A fresh `python -m shoal.launch.worker` spends seconds importing torch and shoal
before it does anything (about 2.5 s of CPU per worker on this project's 2-core
machine), and N workers on few cores pay that N times over: it was most of the
start-up of every small job and of the test suite. So the launcher asks a
multiprocessing *forkserver* — one process that imported torch and shoal once —
to fork each worker, which then starts in milliseconds. Forking it is safe
because the server only imported modules: no CUDA context, no thread pool, no
process group, no store.

What `subprocess.Popen` gave an exec'd worker, a forked one sets up itself, first
thing (:func:`_forked_main`): its environment (replaced wholesale), a process
group of its own (a terminal's Ctrl-C reaches the launcher alone), stdin from /dev/null,
stdout and stderr on the descriptors the launcher hands over (its own, or the
rank's output file), the run lock's descriptor (held until the worker exits), its
command line as `ps` shows it (setproctitle), and its CPU threads
(OMP_NUM_THREADS was read when the server imported torch, so it is applied
explicitly).

A process group, not a session: where Linux groups the scheduling of processes by
session (autogroup, on by default in most distributions and on this project's
machine), a session per worker makes each worker a scheduling group of its own, and
when workers outnumber the cores a worker's communication thread then waits for its
own group's turn: a hybrid pipeline 2 x tensor 2 on 2 cores ran at 0.93 of the same
torch script started as plain processes, 1.03 with process groups (benchmarks/
RESULTS.md, session 11).

The forkserver's parent is the launcher, and it is killed when the launcher dies
(launch/preload.py), so a worker's "die with the launcher" signal (worker.py)
still fires, at once, when the launcher is killed. (A worker also closes its end
of the server's "alive" pipe, which multiprocessing hands to every process it
forks, so that nothing but the launcher keeps the server alive.)

A worker is exec'd instead when a fork could not give the same process:
`SHOAL_WORKER_START=exec` in the launcher's environment, a platform without
forkserver, or a PYTHONPATH other than the one the server started with (the
server imported shoal and any plugin from its own path).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from multiprocessing import forkserver, reduction
from multiprocessing.process import BaseProcess
from typing import IO, Any, Protocol

import setproctitle

from shoal.launch.processes import rank_title

START_ENV = "SHOAL_WORKER_START"
#: what the server imports once, for every worker it forks (torch and all of shoal's core,
#: and a death signal tied to the launcher)
PRELOAD = ["shoal.launch.preload"]

_server_pythonpath: str | None = None  # PYTHONPATH when the forkserver was set up
_server_ready = False


class WorkerProcess(Protocol):
    """What the launcher needs of a worker process (a `subprocess.Popen` has all of it)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def start_worker(
    argv: list[str], env: Mapping[str, str], output: IO[bytes] | None, keep_fds: tuple[int, ...]
) -> WorkerProcess:
    """Start `python -m shoal.launch.worker ARGV` with environment `env`; its stdout and
    stderr go to `output` (None: the launcher's own), `keep_fds` stay open in it."""
    if _can_fork(env):
        return _fork(argv, env, output, keep_fds)
    return subprocess.Popen(
        [sys.executable, "-m", "shoal.launch.worker", *argv],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
        process_group=0,  # as a forked worker: a process group of its own, not a session
        pass_fds=keep_fds,
    )


def forkserver_context() -> Any:
    """The forkserver context with shoal preloaded (set up once per process, before the
    server starts: its preload list cannot change afterwards)."""
    global _server_ready, _server_pythonpath
    context = multiprocessing.get_context("forkserver")
    if not _server_ready:
        context.set_forkserver_preload(PRELOAD)
        _server_pythonpath = os.environ.get("PYTHONPATH")
        _server_ready = True
    return context


def start_server_early() -> None:
    """Start the forkserver now, without waiting for it.

    It spends about two seconds importing torch and shoal before it can fork a worker.
    Started by `shoal train` before the launcher imports its own modules and plans the job
    (cli/main.py), that import runs on another core at the same time instead of after:
    a multi-worker job starts that much sooner. The first `start_worker` connects to it.
    """
    if os.environ.get(START_ENV, "fork") == "exec":
        return
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    forkserver_context()
    with _main_module_hidden():
        forkserver.ensure_running()


def _can_fork(env: Mapping[str, str]) -> bool:
    if os.environ.get(START_ENV, "fork") == "exec":
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    forkserver_context()
    return env.get("PYTHONPATH") == _server_pythonpath


def _fork(
    argv: list[str], env: Mapping[str, str], output: IO[bytes] | None, keep_fds: tuple[int, ...]
) -> ForkedWorker:
    out = output.fileno() if output is not None else 1  # the launcher's own, as Popen's
    err = output.fileno() if output is not None else 2
    process = forkserver_context().Process(
        target=_forked_main,
        args=(argv, dict(env), _Descriptor(out), _Descriptor(err), *map(_Descriptor, keep_fds)),
        name=f"shoal-worker-{env.get('RANK', '?')}",
    )
    with _main_module_hidden():
        process.start()
    return ForkedWorker(process)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """multiprocessing runs the parent's `__main__` again in every child it starts (to find
    functions defined there): a user's script that calls shoal.api.train without an
    `if __name__ == "__main__"` guard would train again in every worker, and a guarded one
    would still be imported for nothing. The worker's code lives in shoal, so the script
    is hidden from the child's preparation while it is started."""
    main = sys.modules["__main__"]
    names = ("__file__", "__spec__")
    saved: dict[str, Any] = {name: main.__dict__[name] for name in names if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _leave_the_forkserver() -> None:
    """Close this process's end of the forkserver's "alive" pipe.

    multiprocessing gives every process the forkserver starts that pipe's write end (so
    it may ask the same server for children of its own), and the server exits only when
    every holder has closed it. A worker holding it would keep the server alive after
    the launcher died, and with it the worker: its "die with the launcher" signal is
    sent when its parent, the server, exits. A worker that starts processes of its own
    by forkserver gets a server of its own.
    """
    server: Any = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)
        server._forkserver_alive_fd = None
        server._forkserver_address = None


class ForkedWorker:
    """A forked worker behind the `subprocess.Popen` methods the launcher uses."""

    def __init__(self, process: BaseProcess) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        if self.process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"shoal worker {self.pid}", timeout or 0.0)
        return self.process.exitcode


class _Descriptor:
    """A file descriptor sent to the forked process (over the forkserver's socket) when the
    process object is pickled; it unpickles there as the descriptor's number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(duplicate: Any) -> int:
    return int(duplicate.detach())


def _forked_main(argv: list[str], env: dict[str, str], out: int, err: int, *keep: int) -> None:
    """A forked worker's first steps: become what an exec'd one is, then run it."""
    _leave_the_forkserver()
    os.setpgid(0, 0)  # a process group, not a session (the module docstring says why)
    # ps and pgrep -f see the command an exec'd worker runs, not the forkserver's, and its
    # rank: /proc/<pid>/environ shows the server's environment, not this one
    command = [sys.executable, "-m", "shoal.launch.worker", *argv, rank_title(env.get("RANK"))]
    setproctitle.setproctitle(" ".join(command))
    os.environ.clear()
    os.environ.update(env)
    stdin = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
    for fd in (stdin, out, err):
        if fd > 2:
            os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED was read by the server
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=True)
    # `keep` (the run lock) stays open until the process exits

    import torch

    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))

    from shoal.launch.process_group import exit_process
    from shoal.launch.worker import main

    exit_process(main(argv))
