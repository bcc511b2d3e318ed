"""The grading worker pool: runs a check in a child process under a hard timeout.

verify.py's symbolic check (math-verify on sympy) can hang on adversarial input, so it runs through
`run_with_timeout(fn, timeout_s, *args)`: fn(*args), or `_CheckTimeout` after timeout_s seconds,
from any thread. verify.py counts a timeout as a wrong answer (`VerifyStats.timeouts`).

  - On the main thread: signal.setitimer (float seconds, the same SIGALRM mechanism math-verify
    uses), re-firing every 50 ms in case some library code swallows the first interrupt.
  - Off the main thread (signals reach the main thread only): fn runs in a worker process, started
    once (~1 s, it imports math-verify at its start) and reused (~0.2 ms a check); on timeout the
    caller kills it (SIGKILL) and the next check starts a new one. Killing stops anything, a C call
    included: `9^{9^{9^9}}` off the main thread returns after timeout_s.

Why not math-verify's own timeout (0.9.0: `parse(parsing_timeout=5)`, `verify(timeout_seconds=5)`):
it uses signal.alarm, which takes whole seconds, restarts for every parse and every comparison
rather than bounding the check, and raises a ValueError off the main thread. verify.py passes None
to both and guards the whole check (parse gold + parse prediction + compare) here. The alarm
interrupts Python code only: on the main thread a single C call (say a giant integer power) is not
interruptible, which is one reason for verify.py's size cap. POSIX only (SIGALRM, pass_fds).

Test:   python -m pytest -q tests/test_verify.py -k "timeout or worker"
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing.connection
import signal
import socket
import subprocess
import sys
import threading
import time

class _CheckTimeout(BaseException):
    """Raised into a running check. A BaseException, so the `except Exception` blocks inside
    math-verify and sympy cannot swallow it."""


def _with_alarm(fn, timeout_s: float):
    """Main thread: SIGALRM after timeout_s, then every 50 ms until disarmed. Restores the previous
    handler and any outer timer (pytest-timeout, for one) with what is left of it."""
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:  # a late alarm after fn() returned must not hit the caller's code
            raise _CheckTimeout()

    t0 = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer_left, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.05)
    try:
        return fn()
    finally:
        while armed[0]:
            try:
                armed[0] = False  # once this store ran, on_alarm is a no-op
            except _CheckTimeout:  # an alarm landed just before the store: fn() is finished anyway
                pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
        if outer_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - t0), 1e-3))


# Off the main thread signals cannot be used (only the main thread receives them), and a thread
# cannot be stopped from outside: an asynchronous exception raised into a thread lands only at its
# next bytecode. `9^{9^{9^9}}` is one long C call in sympy's integer power, so such a thread never
# sees the exception, holds the GIL, and the caller hangs with it. A process can be killed whatever
# it is doing, so the check runs in a child process, kept alive between checks (python + sympy
# start in ~1-2 s; a check then costs a pipe round trip, ~0.2 ms) and killed and replaced only when
# a check runs out of time.
_READY_TIMEOUT_S = 120.0  # start-up of a worker (interpreter + imports), not counted in timeout_s
_MODULE = __name__  # "engines.grading": what the worker imports to find _worker_main
# The worker is `python -c` importing this module only: multiprocessing's "spawn" would re-run the
# caller's main script in the child (all of it, if it lacks an `if __name__ == "__main__":` guard),
# and "fork" copies a trainer's threads' locks, which can deadlock the child.
_WORKER_MAIN = ("import importlib, sys; sys.path[:0] = sys.argv[3:]; "  # the caller's sys.path, so imports match
                "importlib.import_module(sys.argv[2])._worker_main(int(sys.argv[1]))")
_idle_workers: list = []  # started workers no thread is using; a check takes one out, puts it back
_live_workers: set = set()  # all started workers, for the exit handler
_idle_lock = threading.Lock()


def _worker_main(fd: int) -> None:
    """Child process: import math-verify, say "ready", then run each (fn, args) that arrives and
    send back ("ok", value) or ("error", exception), until the parent closes its end."""
    conn = multiprocessing.connection.Connection(fd)
    _load_math_verify()
    conn.send(("ready", None))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return  # the parent exited
        try:
            conn.send(("ok", fn(*args)))
        except Exception as e:  # noqa: BLE001 - handed to the parent, which counts it
            try:
                conn.send(("error", e))
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                conn.send(("error", RuntimeError(repr(e))))


class _Worker:
    """A `python -c` child running _worker_main, and our end of the socket pair to it."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-c", _WORKER_MAIN, str(theirs.fileno()), _MODULE, *sys.path]
        self.process = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()  # only the child holds it now, so recv() sees EOF if the child dies
        self.conn = multiprocessing.connection.Connection(ours.detach())
        with _idle_lock:
            _live_workers.add(self)
        try:
            ready = self.conn.poll(_READY_TIMEOUT_S) and self.conn.recv()[0] == "ready"
        except (EOFError, OSError):  # it died on start-up; its traceback is on stderr
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(f"verify worker did not start within {_READY_TIMEOUT_S:.0f} s")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: stops a C call too
        self.process.wait()
        self.conn.close()
        with _idle_lock:
            _live_workers.discard(self)


@atexit.register
def _kill_workers() -> None:
    """An idle worker exits by itself when our end closes; a busy one might be in a C call."""
    for worker in list(_live_workers):
        worker.kill()


def _in_child_process(fn, timeout_s: float, args: tuple):
    """Any thread: run fn(*args) in an idle worker process (started on first use); after timeout_s
    kill that worker and raise _CheckTimeout. fn and args travel by pickle: a module-level function."""
    with _idle_lock:
        worker = _idle_workers.pop() if _idle_workers else None
    if worker is not None and not worker.alive():  # died while idle (killed from outside, say)
        worker.kill()
        worker = None
    if worker is None:
        worker = _Worker()
    try:
        worker.conn.send((fn, args))  # pickles before it writes: an unpicklable fn leaves the pipe clean
    except Exception as e:
        with _idle_lock:
            _idle_workers.append(worker)
        raise TypeError("off the main thread run_with_timeout runs fn in a child process, so fn and "
                        f"args must pickle (a module-level function, not a lambda): {e}") from e
    if not worker.conn.poll(timeout_s):
        worker.kill()
        raise _CheckTimeout()
    try:
        status, value = worker.conn.recv()
    except (EOFError, OSError):  # the child died (say, out of memory): count an error, start anew next time
        worker.kill()
        raise RuntimeError("verify worker process died during a check") from None
    with _idle_lock:
        _idle_workers.append(worker)
    if status == "error":
        raise value
    return value


def run_with_timeout(fn, timeout_s: float, *args):
    """fn(*args) or _CheckTimeout after timeout_s seconds, from any thread. Off the main thread fn
    runs in a child process, so it must be a module-level function and its result must pickle."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _with_alarm(lambda: fn(*args), timeout_s)
    return _in_child_process(fn, timeout_s, args)


# math-verify, imported once per process: by verify.py before its first symbolic check (outside any
# timeout), by a worker at its start.
class _DropTimeoutDisabledWarning(logging.Filter):
    def filter(self, record):  # verify.py passes timeout=None on purpose: run_with_timeout does the timing
        return not record.getMessage().startswith("Timeout is disabled")


_math_verify = None


def _load_math_verify():
    """Imported on first use (0.6 s, sympy), outside any timeout, so the toy's integers never pay it."""
    global _math_verify
    if _math_verify is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _math_verify = math_verify
    return _math_verify
