"""Checkpoint: what makes a run safe to stop and resume exactly, kept out of train.py's loop.

A run of the paper's length (200 steps of M * G = 512 rollouts, App. C) takes hours: a crash, a
Ctrl-C or a preempted machine must not lose it, and continuing must give the steps an unbroken run
would have. So a checkpoint holds everything the next step reads (model, optimizer, lr schedule,
RNG states, the capability tracker's pass rates and F_t history, the prompt sampler's position,
the counters), and this file makes each piece of that safe:
  - save_checkpoint writes checkpoint-<step> atomically (temporary directory, fsync, marker, rename),
    so a crash at any instant leaves a complete checkpoint; find_checkpoint finds the newest one;
  - load_checkpoint restores it; check_resume_flags refuses --resume with flags of another run
    (RESUME_MAY_CHANGE lists those that may differ);
  - read_log / truncate_log keep the JSONL log in step with the checkpoint on resume;
  - RunLock lets one run at a time use OUTPUT_DIR; prepare_run_dir settles fresh/--resume/--overwrite;
  - GracefulInterrupt turns the first Ctrl-C into "finish this step, checkpoint, exit".
Tests: tests/test_reliability.py (a crash after every file operation of a save), tests/test_train.py.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import torch

def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CHECKPOINT = "checkpoint-"  # OUTPUT_DIR/checkpoint-<step>/: model, tokenizer, run_config.json, trainer_state.pt
COMPLETE = "COMPLETE"  # written last into a checkpoint: a directory without it is not one
# Flags that may differ on --resume: the run's length, where and how often it writes, and speed or
# memory knobs that leave the algorithm alone. Every other flag must match the saved run.
RESUME_MAY_CHANGE = ("steps", "output_dir", "resume", "overwrite", "no_progress", "save_every", "eval_every",
                     "threads", "device", "micro_batch_size", "generation_batch_size", "gradient_checkpointing",
                     "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "shared_prompt_forward",
                     "sampler_logps", "shared_prompt_prefill")


def run_config(args) -> dict:
    """The run's flags as JSON: the log's first line, and run_config.json in each checkpoint."""
    return {k: v for k, v in vars(args).items() if k != "schedule_obj"}


def _save_step_done(what: str) -> None:
    """Called after each file operation of save_checkpoint; does nothing. tests/test_reliability.py
    replaces it to crash the save after every operation in turn."""


def _fsync(path: Path) -> None:
    """Flush a file, or a directory's entries, to disk: a rename survives power loss only once synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_step(path: Path) -> int | None:
    """The step of a complete checkpoint directory (checkpoint-<step> holding COMPLETE), else None."""
    name = path.name
    if not name.startswith(CHECKPOINT) or not name[len(CHECKPOINT):].isdigit() or not (path / COMPLETE).exists():
        return None
    return int(name[len(CHECKPOINT):])


def find_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint in OUTPUT_DIR (None if there is none). Half-written `.tmp`
    directories and directories without the marker are ignored, whatever moment a crash hit."""
    steps = {checkpoint_step(d): d for d in out.iterdir() if d.is_dir()} if out.is_dir() else {}
    steps.pop(None, None)
    return steps[max(steps)] if steps else None


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, scheduler, tracker, sampler,
                    args, counters: dict) -> Path:
    """Write OUTPUT_DIR/checkpoint-<step> so that a crash at any instant leaves a complete checkpoint:
      1. everything goes into checkpoint-<step>.tmp, each file is synced, the COMPLETE marker last;
      2. one rename (atomic on POSIX) makes it checkpoint-<step>; the directory entry is synced;
      3. only then are the older checkpoints deleted (marker first: a half-deleted one is not complete).
    Before 2, find_checkpoint still sees the previous checkpoint; from 2 on, the new one.
    tests/test_reliability.py crashes the save after each operation and resumes."""
    tmp, final = out / f"{CHECKPOINT}{step}.tmp", out / f"{CHECKPOINT}{step}"
    if checkpoint_step(final) == step:  # this step is saved already
        return final
    shutil.rmtree(tmp, ignore_errors=True)  # what a crashed save of this step left
    _save_step_done("clear tmp")
    model.save_pretrained(tmp)
    _save_step_done("model")
    tokenizer.save_pretrained(tmp)
    _save_step_done("tokenizer")
    (tmp / "run_config.json").write_text(json.dumps(run_config(args)))  # read by --resume's flag check
    _save_step_done("run_config")
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "tracker": tracker.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state(),
                "counters": counters, "args": run_config(args)}, tmp / "trainer_state.pt")
    _save_step_done("trainer_state")
    for f in tmp.rglob("*"):
        if f.is_file():
            _fsync(f)
    _save_step_done("sync files")
    (tmp / COMPLETE).write_text(f"{step}\n")
    _fsync(tmp / COMPLETE)
    _fsync(tmp)
    _save_step_done("marker")
    shutil.rmtree(final, ignore_errors=True)  # a checkpoint-<step> without the marker is not complete
    tmp.rename(final)
    _save_step_done("rename")
    _fsync(out)
    _save_step_done("sync dir")
    for old in sorted(d for d in out.iterdir() if d.is_dir() and d.name.startswith("checkpoint") and d != final):
        (old / COMPLETE).unlink(missing_ok=True)
        _save_step_done(f"unmark {old.name}")
        shutil.rmtree(old)
        _save_step_done(f"delete {old.name}")
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, tracker, sampler) -> tuple[int, dict]:
    """Restore a checkpoint into the live objects (and the RNG states); returns (step, counters)."""
    from transformers import AutoModelForCausalLM

    state = torch.load(path / "trainer_state.pt", weights_only=False, map_location="cpu")
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=model.dtype).state_dict())
    optimizer.load_state_dict(state["optimizer"])  # moves the moments to the parameters' device
    scheduler.load_state_dict(state["scheduler"])
    try:
        tracker.load_state_dict(state["tracker"])
    except ValueError as e:
        raise SystemExit(f"error: cannot resume from {path}: {e}")
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    return state["step"], state["counters"]


def check_resume_flags(saved: dict, args, path: Path) -> None:
    """Refuse, in one line naming each difference, to resume with flags that define another run:
    a new --learning-rate would otherwise be ignored (the optimizer state holds the old one) and a new
    --dataset or --seed silently mixed into the old run. Flags the checkpoint does not know are skipped."""
    now = run_config(args)
    diffs = [f"--{k.replace('_', '-')} {saved[k]} -> {now[k]}" for k in sorted(now)
             if k in saved and k not in RESUME_MAY_CHANGE and saved[k] != now[k]]
    if diffs:
        raise SystemExit(f"error: cannot resume {path}: flags differ from the saved run: {', '.join(diffs)} "
                         "(only --steps, --output-dir and speed, memory or logging flags may change; "
                         "or pass --overwrite, or another --output-dir)")
    step = checkpoint_step(path)
    if step > args.steps:
        raise SystemExit(f"error: cannot resume {path}: it is at step {step}, past --steps {args.steps}")


def read_log(path: Path) -> list[dict]:
    """The JSONL log's records. A line that does not parse (the torn last line of a killed run) is
    dropped rather than fatal: flush() after every line means only the last one can be torn."""
    records = []
    if path.exists():
        for line in path.read_text(errors="replace").split("\n"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def truncate_log(path: Path, step: int, keep_summary: bool = True) -> list[dict]:
    """On resume, keep the records up to the checkpoint's step, so the log matches the state; a run
    extended past its end (keep_summary=False) loses its old summary. Written to a temporary file and
    renamed, so a crash here leaves the old log whole. Returns the kept records."""
    keep = [r for r in read_log(path)
            if r.get("step", -1) <= step and (keep_summary or r.get("type") != "summary")]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return keep


class RunLock:
    """One run per OUTPUT_DIR: an exclusive flock on OUTPUT_DIR/.lock, which holds the holder's pid.
    The kernel drops a flock when its process ends, even on kill -9, so a crashed run never blocks
    --resume, and no guess that an old pid is dead is needed (pids get reused). POSIX only (fcntl)."""

    def __init__(self, out: Path):
        self.path, self.fd = out / ".lock", None

    def __enter__(self):
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SystemExit(f"error: {self.path.parent} is in use by another run (pid {holder}): wait "
                             "for it to end, or pass another --output-dir")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock; the file stays (deleting it would race a run taking it)


def prepare_run_dir(out: Path, args) -> Path | None:
    """Under the lock, settle what this run does with OUTPUT_DIR; returns the checkpoint to resume from.
    A fresh run refuses a directory that holds a run (a log with lines, or a checkpoint) unless
    told --resume (continue the newest complete checkpoint) or --overwrite (delete log and checkpoints)."""
    log_path = out / "log.jsonl"
    found = sorted(d.name for d in out.iterdir() if d.is_dir() and d.name.startswith("checkpoint"))
    if log_path.exists() and log_path.stat().st_size > 0:
        found.insert(0, log_path.name)
    if args.overwrite:
        for name in found:
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        return None
    if not args.resume:
        if found:
            raise SystemExit(f"error: {out} already holds a run ({', '.join(found[:3])}): pass --resume to "
                             "continue it, --overwrite to replace it, or another --output-dir")
        return None
    path = find_checkpoint(out)
    if path is None:
        print(f"--resume: no complete checkpoint in {out}, starting fresh", file=sys.stderr)
        return None
    check_resume_flags(json.loads((path / "run_config.json").read_text()), args, path)
    return path


class GracefulInterrupt:
    """First Ctrl-C: finish the current step, checkpoint, exit. Second Ctrl-C: stop at once."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupt: finishing this step, then saving a checkpoint (Ctrl-C again to abort)",
              file=sys.stderr)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)
