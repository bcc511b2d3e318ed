"""Running a sweep's train.py processes (compare.py): a queue of runs, N at a time, each stopped
cleanly when the sweep is.

A sweep of 30 runs takes hours; compare.py must be safe to stop and to lose. So each run is a
train.py subprocess in its own session (a terminal's Ctrl-C reaches compare.py only, which passes it
on once), told to stop if compare.py dies even by kill -9 (sigint_when_parent_dies); train.py takes
that SIGINT as Ctrl-C: finish the step, checkpoint, exit 130. Ctrl-C, SIGTERM or a failed run stop
the queue (Stopper): no new run starts and the running ones checkpoint and stop; the next compare.py
reuses the finished runs and resumes the stopped ones (train.py --resume).

    sigint_when_parent_dies   in the child, before train.py starts (Linux prctl; elsewhere a no-op)
    Stopper                   SIGINT/SIGTERM handlers that pass SIGINT on to every running run
    run_queue                 the queue: start, poll, report a failure with its output's tail, stop
    tail                      the last lines of a run's output
Which command a run is, and where it writes, is compare.py's (launch, run_dir_for).
Tests: tests/test_compare.py (a fake train.py: a failure, Ctrl-C, compare.py killed), tests/test_paths.py.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path


def sigint_when_parent_dies(parent: int) -> None:
    """In the child, before train.py starts (Linux): ask the kernel for a SIGINT when compare.py
    dies, even by kill -9, when it can pass nothing on. train.py takes that SIGINT as Ctrl-C
    (finish the step, checkpoint, exit 130), so no orphan trains on unseen and holds its run
    directory's lock against the next `compare.py`, which resumes it. prctl(PR_SET_PDEATHSIG = 1);
    elsewhere a no-op. If compare.py died before this line ran, the signal is sent here at once."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGINT)


def tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no output)"
    return "\n".join(text.splitlines()[-lines:])


class Stopper:
    """SIGINT (Ctrl-C) or SIGTERM while runs go: launch no more; pass SIGINT on to every running
    train.py (its first SIGINT: finish the step, checkpoint, exit; a second: stop at once). A failed
    run does the same. Handlers are installed only in the main thread (signal's rule)."""

    def __init__(self):
        self.running: dict = {}  # Popen -> (arm, seed)
        self.signals, self.reason = 0, None

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handler(self, signum, frame):
        self.signals += 1
        name = signal.Signals(signum).name
        print(f"\n{name}: starting no more runs; asking the {len(self.running)} running to checkpoint and stop"
              + (" (again: they stop at once)" if self.signals > 1 else " (again: stop them at once)"),
              file=sys.stderr, flush=True)
        self.stop(name)

    def stop(self, reason: str):
        self.reason = self.reason or reason
        for proc in self.running:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)


def run_queue(todo: list, start, run_dir_of, is_finished, parallel: int, on_finished) -> None:
    """Run the (arm, seed) jobs, `parallel` at a time: start(arm, seed) -> its train.py process, which
    writes to run_dir_of(arm, seed) (its output: train.out there; is_finished(run_dir): did the run
    finish); on_finished(arm, seed) as each one finishes.
    A failed run is reported at once with its output's tail, and stops the queue: no new run starts
    and the running ones are asked to checkpoint and stop. Ctrl-C / SIGTERM likewise. Either way
    this ends with SystemExit (non-zero) and how to resume; nothing a run wrote is lost."""
    pending, failed, stopped = list(todo), [], []
    with Stopper() as stopper:
        while stopper.running or (pending and stopper.reason is None):
            while pending and len(stopper.running) < parallel and stopper.reason is None:
                arm, seed = pending.pop(0)
                stopper.running[start(arm, seed)] = (arm, seed)
            time.sleep(0.05)
            for proc, (arm, seed) in list(stopper.running.items()):
                if proc.poll() is None:
                    continue
                del stopper.running[proc]
                run_dir = run_dir_of(arm, seed)
                if is_finished(run_dir):
                    on_finished(arm, seed)
                elif stopper.reason is not None:
                    stopped.append((arm, seed))
                else:
                    failed.append((arm, seed, proc.returncode))
                    print(f"\nrun {arm} seed {seed} failed (exit {proc.returncode}); the end of "
                          f"{run_dir / 'train.out'}:\n{tail(run_dir / 'train.out')}\n", file=sys.stderr, flush=True)
                    stopper.stop("failure")
    left = f"{len(stopped)} stopped at their last checkpoint, {len(pending)} not started"
    if failed:
        arm, seed, code = failed[0]
        print(f"error: run {arm} seed {seed} failed (exit {code}; output above and in "
              f"{run_dir_of(arm, seed) / 'train.out'}); {left}: fix the cause and run the same "
              "command again (finished runs are reused, stopped ones resume)", file=sys.stderr)
        raise SystemExit(1)
    if stopper.reason is not None:
        print(f"interrupted ({stopper.reason}): {left}; run the same command again to resume "
              "(finished runs are reused, stopped ones continue with --resume)", file=sys.stderr)
        raise SystemExit(130)
