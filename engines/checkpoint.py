"""Checkpoint: what makes a run safe to stop and resume exactly, kept out of train.py's loop.

A run of the paper's length (200 steps of M * G = 512 rollouts, App. C) takes hours: a crash, a
Ctrl-C or a preempted machine must not lose it, and continuing must give the steps an unbroken run
would have. So a checkpoint holds everything the next step reads (model, optimizer, lr schedule,
RNG states, the capability tracker's pass rates and F_t history, the prompt sampler's position,
the counters), and this file makes each piece of that safe:
  - save_checkpoint writes checkpoint-<step> atomically (temporary directory, fsync, marker, rename),
    so a crash at any instant leaves a complete checkpoint, and keeps the previous one beside it; a
    full disk is one line; find_checkpoint finds the newest one;
  - resume_checkpoint restores the newest checkpoint that loads, setting a damaged one aside, and
    resume_every_rank does it under torchrun (rank 0 picks it, the other ranks load the same one);
    finished_summary says whether --resume has anything left to do;
    check_resume_flags / check_identity refuse --resume with flags, data or model of another run
    (RESUME_MAY_CHANGE lists the flags that may differ);
  - read_log / truncate_log keep the JSONL log in step with the checkpoint on resume;
  - RunLock lets one run at a time use OUTPUT_DIR; prepare_run_dir settles fresh/--resume/--overwrite,
    and remove_run deletes an old run only once the new one's setup has succeeded;
  - GracefulInterrupt turns the first Ctrl-C or SIGTERM into "finish this step, checkpoint, exit";
  - nonfinite finds a NaN/inf update before it can reach a checkpoint (train.stop_if_nonfinite stops).
What a run deletes is only its own: `checkpoint-<digits>` and `checkpoint-<digits>.tmp` directories
(OURS), and log.jsonl; never another name in OUTPUT_DIR, and never a checkpoint set aside as damaged.
Tests: tests/test_reliability.py (a crash after every file operation of a save), tests/test_safety.py
(what is deleted, signals, damaged checkpoints, a full disk, changed data), tests/test_train.py.
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from harness import data
from engines import dist
from engines import lora
from harness import models


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
# What this code creates in OUTPUT_DIR, and so all it may delete: checkpoint-<digits>[.tmp]. A user's
# checkpoint-4.bak, checkpoint-best or checkpoints_notes/ is not ours and stays.
OURS = re.compile(r"checkpoint-(\d+)(\.tmp)?")
# Complete checkpoints kept on disk: the newest and the one before it, so a newest one damaged later
# (a truncated copy, a bad sector) still leaves one to resume from. A save first deletes all but the
# newest, then writes the new one: it needs room for KEEP checkpoints at its peak, not KEEP + 1.
KEEP = 2
# Flags that may differ on --resume: the run's length, where and how often it writes, and speed or
# memory knobs that leave the algorithm alone. Every other flag must match the saved run.
RESUME_MAY_CHANGE = ("steps", "output_dir", "resume", "overwrite", "no_progress", "save_every", "eval_every",
                     "threads", "device", "micro_batch_size", "generation_batch_size", "gradient_checkpointing",
                     "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "report_to", "log_completions",
                     "eval_samples", "shared_prompt_forward", "sampler_logps", "shared_prompt_prefill", "grouped_kv_attention",
                     "max_rollouts", "eval_every_rollouts")  # evaluation draws from its own RNG (evaluate.run_eval): the steps are the same


# Not flags: what setup measured of the data and the model (data.data_identity, models.model_identity),
# recorded beside the flags and compared by check_identity rather than check_resume_flags.
IDENTITY_KEYS = ("data_identity", "model_identity")


def run_config(args) -> dict:
    """The run's flags as JSON: the log's first line, and run_config.json in each checkpoint."""
    return {k: v for k, v in vars(args).items() if k != "schedule_obj"}


def is_ours(path: Path) -> bool:
    """True for a directory this code created: checkpoint-<digits> or checkpoint-<digits>.tmp."""
    return OURS.fullmatch(path.name) is not None and path.is_dir()


def our_dirs(out: Path) -> list[Path]:
    return sorted((d for d in out.iterdir() if is_ours(d)), key=lambda d: (int(OURS.fullmatch(d.name)[1]), d.name))


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
    match = OURS.fullmatch(path.name)
    if match is None or match[2] or not (path / COMPLETE).exists():
        return None
    return int(match[1])


def complete_checkpoints(out: Path) -> list[Path]:
    """OUTPUT_DIR's complete checkpoints, newest first. Half-written `.tmp` directories and directories
    without the marker are left out, whatever moment a crash hit."""
    steps = {checkpoint_step(d): d for d in out.iterdir() if d.is_dir()} if out.is_dir() else {}
    steps.pop(None, None)
    return [steps[k] for k in sorted(steps, reverse=True)]


def find_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint in OUTPUT_DIR (None if there is none)."""
    found = complete_checkpoints(out)
    return found[0] if found else None


def damage(path: Path) -> str | None:
    """Why a complete checkpoint cannot be loaded, found cheaply (no file read but the small ones): a
    file its COMPLETE marker lists that is missing or of another size (a truncated copy, a disk that
    filled up later), or a run_config.json that does not parse. None: nothing found (loading may still
    fail: resume_checkpoint catches that). A marker of older code holds only the step: sizes unchecked."""
    try:
        marker = json.loads((path / COMPLETE).read_text())
    except (OSError, ValueError):
        return "its COMPLETE marker is unreadable"
    for name, size in (marker.get("files", {}) if isinstance(marker, dict) else {}).items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, its marker recorded {size}"
    try:
        json.loads((path / "run_config.json").read_text())
    except (OSError, ValueError) as e:
        return f"run_config.json: {type(e).__name__}"
    return None


def _free_bytes(path: Path) -> int:
    """Free space on path's file system (a function, so a test can fake a full disk)."""
    return shutil.disk_usage(path).free


def _human(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def checkpoint_bytes(model, optimizer) -> int:
    """About what one checkpoint takes on disk: the weights and the optimizer's state tensors (AdamW:
    two moments per weight, so ~3x the weights), as held in memory."""
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for state in optimizer.state_dict()["state"].values():
        n += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))
    return n


def save_failed(out: Path, step: int, error: Exception, size: int, kept: Path | None) -> str:
    """The one line a failed save stops with. A full disk (ENOSPC, a quota, or torch.save's
    "unexpected pos" with nothing free) says how much room a save needs."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    free = _free_bytes(out)
    full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free < size
    why = f"the disk is full ({_human(free)} free)" if full else f"{type(error).__name__}: {first}"
    resume = f"continue from {kept.name} with --resume" if kept else "start again"
    return (f"error: cannot save {CHECKPOINT}{step} in {out}: {why}; a save needs room for {KEEP} checkpoints "
            f"of about {_human(size)} each (the last one is kept until the next is written): free space "
            f"(or pass another --output-dir), then {resume}")


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, scheduler, tracker, sampler,
                    args, counters: dict, run_end: bool = False) -> Path:
    """write_checkpoint on rank 0 with every rank's RNG state (under torchrun: the weights and optimizer
    are the same on every rank, the RNG is not); all ranks call it and get the path, or its error.
    run_end: the run's last step (at --steps, or its --max-rollouts spent): a LoRA run also gets merged/."""
    rank_rngs = dist.gather_object(rng_state())  # a collective: every rank, before anything can fail
    # --fsdp: each rank holds a shard; gather the full weights and optimizer state to rank 0 (a collective
    # too), so the checkpoint has the one-process format (engines/dist.py: full_state)
    full = dist.full_state(model, optimizer) if dist.is_sharded(model) else (None, None)
    return dist.on_rank0(write_checkpoint, out, step, model, tokenizer, optimizer, scheduler, tracker, sampler,
                         args, counters, rank_rngs, *full, run_end=run_end)


def write_checkpoint(out: Path, step: int, model, tokenizer, optimizer, scheduler, tracker, sampler,
                     args, counters: dict, rank_rngs: list[dict] | None = None, weights: dict | None = None,
                     optimizer_state: dict | None = None, run_end: bool = False) -> Path:
    """Write OUTPUT_DIR/checkpoint-<step> so that a crash at any instant leaves a complete checkpoint:
      0. make room: delete our directories but the newest complete checkpoint (older checkpoints, a
         crashed save's .tmp), marker first (a half-deleted one is not complete);
      1. everything goes into checkpoint-<step>.tmp, each file is synced, then the COMPLETE marker,
         which lists every file's size (damage() compares them on resume);
      2. one rename (atomic on POSIX) makes it checkpoint-<step>; the directory entry is synced.
    Before 2, find_checkpoint sees the previous checkpoint; from 2 on, the new one; the previous one
    stays until the next save (KEEP = 2). A write that fails (a full disk: OSError, or torch.save's
    RuntimeError) removes the .tmp and stops with one line saying how much room a save needs.
    weights, optimizer_state: --fsdp's full state (dist.full_state) in place of the live objects' own.
    run_end: the run's last checkpoint; with --use-peft it also holds merged/ (lora.save_merged).
    tests/test_reliability.py crashes the save after each operation and resumes."""
    tmp, final = out / f"{CHECKPOINT}{step}.tmp", out / f"{CHECKPOINT}{step}"
    if checkpoint_step(final) == step:  # this step is saved already
        return final
    kept = find_checkpoint(out)
    for old in our_dirs(out):
        if old != kept:
            (old / COMPLETE).unlink(missing_ok=True)
            _save_step_done(f"unmark {old.name}")
            shutil.rmtree(old)
            _save_step_done(f"delete {old.name}")
    try:
        model.save_pretrained(tmp, state_dict=weights)  # --use-peft: the adapter only (adapter_model.safetensors, peft's format)
        # the run's end (at --steps, or on --max-rollouts as DAPO's arm ends): also a plain model, W + s B A
        if lora.is_lora(model) and run_end:
            lora.save_merged(model, tokenizer, tmp / "merged")
            (tmp / "merged" / "run_config.json").write_text(json.dumps(run_config(args)))  # --model keeps its preset
        _save_step_done("model")
        tokenizer.save_pretrained(tmp)
        _save_step_done("tokenizer")
        (tmp / "run_config.json").write_text(json.dumps(run_config(args)))  # read by --resume's checks
        _save_step_done("run_config")
        rank_rngs = rank_rngs or [rng_state()]  # "rng": rank 0's, as checkpoints of one process always had
        optim = optimizer_state if optimizer_state is not None else optimizer.state_dict()
        torch.save({"step": step, "optimizer": optim, "scheduler": scheduler.state_dict(),
                    "tracker": tracker.state_dict(), "sampler": sampler.state_dict(), "rng": rank_rngs[0],
                    "rank_rngs": rank_rngs, "counters": counters, "args": run_config(args)}, tmp / "trainer_state.pt")
        _save_step_done("trainer_state")
        files = {}
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                _fsync(f)
                files[str(f.relative_to(tmp))] = f.stat().st_size
        _save_step_done("sync files")
        (tmp / COMPLETE).write_text(json.dumps({"step": step, "files": files}) + "\n")
        _fsync(tmp / COMPLETE)
        _fsync(tmp)
    except (OSError, RuntimeError, SafetensorError) as e:  # ENOSPC, EDQUOT, "unexpected pos", EIO
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written .tmp would only take more room
        raise SystemExit(save_failed(out, step, e, checkpoint_bytes(model, optimizer), kept))
    _save_step_done("marker")
    tmp.rename(final)
    _save_step_done("rename")
    _fsync(out)
    _save_step_done("sync dir")
    return final


def nonfinite(metrics: dict, model) -> list[str]:
    """What went NaN or inf in this step's update: 'loss', 'grad_norm', 'weights' (empty: all finite).
    Checked before the step can reach a checkpoint, so the last checkpoint saved stays finite."""
    bad = [key for key in ("loss", "grad_norm") if key in metrics and not math.isfinite(metrics[key])]
    if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):  # one sync
        bad.append("weights")
    return bad


class DamagedCheckpoint(Exception):
    """A complete checkpoint whose files do not load (truncated, overwritten): resume falls back."""


def load_checkpoint(path: Path, model, optimizer, scheduler, tracker, sampler) -> tuple[int, dict]:
    """Restore a checkpoint into the live objects (and the RNG states); returns (step, counters).
    Both files are read before anything is changed, so one that does not load (DamagedCheckpoint)
    leaves the live objects as they were, for resume_checkpoint to try the previous checkpoint."""
    from transformers import AutoModelForCausalLM

    def read(name: str, reader):
        try:
            return reader()
        except Exception as e:  # a truncated zip or safetensors file raises whatever its reader raises
            first = (str(e).strip().splitlines() or [""])[0][:120]
            raise DamagedCheckpoint(f"{name}: {type(e).__name__}: {first}")

    state = read("trainer_state.pt", lambda: torch.load(path / "trainer_state.pt", weights_only=False,
                                                        map_location="cpu"))
    ranks, saved_by = dist.current(), len(state.get("rank_rngs", [None]))
    if saved_by != ranks.world_size:  # each rank's RNG (its rollouts) was saved: the same ranks must go on
        how = "python train.py" if saved_by == 1 else f"torchrun --nproc_per_node {saved_by} (in all)"
        raise SystemExit(f"error: cannot resume {path}: it was saved by {saved_by} process(es) and this run has "
                         f"{ranks.world_size}: resume with {how}")
    if lora.is_lora(model):  # --use-peft: the adapter (the base is --model's, checked by check_identity)
        lora.load_adapter(model, read("model", lambda: lora.read_adapter(path)))
    elif dist.is_sharded(model):  # --fsdp: this rank's shards cut from the full state, no collective
        weights = read("model", lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
        dist.load_full_state(model, optimizer, weights, state["optimizer"])
    else:
        model.load_state_dict(read("model", lambda: AutoModelForCausalLM.from_pretrained(
            path, dtype=model.dtype).state_dict()))
    if not dist.is_sharded(model):
        optimizer.load_state_dict(state["optimizer"])  # moves the moments to the parameters' device
    scheduler.load_state_dict(state["scheduler"])
    try:
        tracker.load_state_dict(state["tracker"])
    except ValueError as e:
        raise SystemExit(f"error: cannot resume from {path}: {e}")
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state.get("rank_rngs", [state["rng"]])[ranks.rank])
    return state["step"], state["counters"]


def resume_checkpoint(out: Path, model, optimizer, scheduler, tracker, sampler) -> tuple[Path, int, dict]:
    """Load the newest complete checkpoint that loads: (its path, step, counters). One that is damaged
    (damage(), or loading fails) is skipped for the one before it; once one loads, each damaged one is
    renamed <name>.damaged (kept, never deleted: it is no longer ours) with a one-line warning, so the
    next save cannot take its name. If none loads, stop in one line and rename nothing."""
    damaged = []
    for path in complete_checkpoints(out):
        why = damage(path)
        if why is None:
            try:
                step, counters = load_checkpoint(path, model, optimizer, scheduler, tracker, sampler)
            except DamagedCheckpoint as e:
                why = str(e)
        if why is not None:
            damaged.append((path, why))
            continue
        for bad, why in damaged:
            aside = bad.with_name(bad.name + ".damaged")
            n = 1
            while aside.exists():
                n += 1
                aside = bad.with_name(f"{bad.name}.damaged-{n}")
            bad.rename(aside)
            print(f"warning: {bad.name} is damaged ({why}): moved to {aside.name} (not deleted); "
                  f"resuming from {path.name}", file=sys.stderr)
        return path, step, counters
    listed = "; ".join(f"{p.name}: {why}" for p, why in damaged) or "none is complete"
    raise SystemExit(f"error: no checkpoint in {out} loads ({listed}): restore one, or pass --overwrite "
                     "to start again")


def resume_every_rank(out: Path, model, optimizer, scheduler, tracker, sampler, steps: int) -> tuple[Path, int, dict]:
    """--resume, in one process or under torchrun: the newest checkpoint that loads (resume_checkpoint:
    a damaged one is set aside with a warning) restored on every rank. Rank 0 picks it and cuts the log
    back to its step (keeping the summary of a run that had finished: steps = --steps); the other ranks
    then load the same one. Returns (its path, step, counters)."""
    path, step, counters = dist.on_rank0(resume_checkpoint, out, model, optimizer, scheduler, tracker, sampler)
    if not dist.current().main:
        load_checkpoint(path, model, optimizer, scheduler, tracker, sampler)
    else:
        truncate_log(out / "log.jsonl", step, keep_summary=step >= steps)
    return path, step, counters


def saved_config(path: Path | None) -> dict:
    """The recorded flags and identities (run_config.json) of the checkpoint --resume continues; {} for
    a fresh run, or when unreadable (resume_checkpoint then names the damage)."""
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((path / "run_config.json").read_text())
    return {}


def finished_summary(out: Path, resume_from: Path | None, args) -> dict | None:
    """The summary of a run that these flags would not extend: its newest checkpoint is its last step,
    at --steps, or with its --max-rollouts spent (DAPO's arm ends on rollouts). None otherwise."""
    step = checkpoint_step(resume_from) if resume_from is not None else None
    summary = next((r for r in read_log(out / "log.jsonl") if r.get("type") == "summary"), None)
    if step is None or summary is None or summary.get("step", step) != step:
        return None
    spent = args.max_rollouts is not None and summary.get("rollouts", 0) >= args.max_rollouts
    return summary if step == args.steps or spent else None


def check_resume_flags(saved: dict, args, path: Path) -> None:
    """Refuse, in one line naming each difference, to resume with flags that define another run:
    a new --learning-rate would otherwise be ignored (the optimizer state holds the old one) and a new
    --dataset or --seed silently mixed into the old run. Flags the checkpoint does not know are skipped."""
    now = run_config(args)
    # --bf16 None: older code recorded it unresolved (default: on for a GPU): unknown, like a missing flag.
    unknown = {k for k in ("bf16",) if saved.get(k, 0) is None}
    diffs = [f"--{k.replace('_', '-')} {saved[k]} -> {now[k]}" for k in sorted(now)
             if k in saved and k not in RESUME_MAY_CHANGE + IDENTITY_KEYS and k not in unknown and saved[k] != now[k]]
    if diffs:
        raise SystemExit(f"error: cannot resume {path}: flags differ from the saved run: {', '.join(diffs)} "
                         "(only --steps, --output-dir and speed, memory or logging flags may change; "
                         "or pass --overwrite, or another --output-dir)")
    step = checkpoint_step(path)
    if step > args.steps:
        raise SystemExit(f"error: cannot resume {path}: it is at step {step}, past --steps {args.steps}")


def changed_flags(saved: dict, args) -> dict:
    """{flag: [saved, now]} for the flags of RESUME_MAY_CHANGE a resume changed (--resume itself
    aside): logged in a `resume` record, so the log says which settings produced which steps."""
    now = run_config(args)
    return {k: [saved[k], now[k]] for k in sorted(now) if k in RESUME_MAY_CHANGE and k in saved
            and k not in ("resume", "overwrite") and saved[k] != now[k]}


def check_identity(saved: dict, args, path: Path) -> None:
    """Refuse, in one line, to resume when the data or the model are not those of the saved run: the
    saved pass rates and prompt indices would point at other problems, and the tokenizer (and the
    --beta reference model) come from --model, not from the checkpoint. Base weights that differ
    alone only warn (the checkpoint's weights are the ones trained) unless --beta > 0 uses them or
    --use-peft trains an adapter on top of them (its checkpoints hold the adapter, not the base)."""
    if saved.get("data_identity") and args.data_identity:
        what = data.identity_change(saved["data_identity"], args.data_identity)
        if what:
            raise SystemExit(f"error: cannot resume {path}: {what} (its prompt indices and "
                             "pass rates would point at other problems): restore it, or start a new run "
                             "with --overwrite or another --output-dir")
    if saved.get("model_identity") and args.model_identity:
        what, weights_only = models.identity_change(saved["model_identity"], args.model_identity)
        if what and (not weights_only or args.beta > 0 or getattr(args, "use_peft", False)):  # LoRA: W is frozen
            raise SystemExit(f"error: cannot resume {path}: {what}: restore --model {args.model} as it was, "
                             "or start a new run with --overwrite or another --output-dir")
        if what:
            print(f"warning: {what}; the checkpoint's own weights are resumed", file=sys.stderr)


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
    A fresh run refuses a directory that holds a run (a log with lines, or one of our checkpoint
    directories) unless told --resume (continue the newest complete checkpoint) or --overwrite
    (replace it: remove_run, called by setup once the new run's data and model have loaded, so a
    typo in --dataset or --model fails with the old run intact). --resume removes stale .tmp
    directories (a save killed mid-way, or one that filled the disk)."""
    log_path = out / "log.jsonl"
    found = [d.name for d in our_dirs(out)]
    if log_path.exists() and log_path.stat().st_size > 0:
        found.insert(0, log_path.name)
    if args.overwrite:
        return None
    if not args.resume:
        if found:
            raise SystemExit(f"error: {out} already holds a run ({', '.join(found[:3])}): pass --resume to "
                             "continue it, --overwrite to replace it, or another --output-dir")
        return None
    for stale in our_dirs(out):
        if stale.name.endswith(".tmp"):
            shutil.rmtree(stale)
    # The newest checkpoint that looks whole: resume_checkpoint, in setup, loads it or an older one.
    path = next((p for p in complete_checkpoints(out) if damage(p) is None), None)
    if path is None:
        if complete_checkpoints(out):  # all damaged: resume_checkpoint's one-line refusal names them
            return find_checkpoint(out)
        print(f"--resume: no complete checkpoint in {out}, starting fresh", file=sys.stderr)
        return None
    check_resume_flags(json.loads((path / "run_config.json").read_text()), args, path)
    return path


def remove_run(out: Path) -> None:
    """--overwrite, once setup has succeeded: delete the old run's log and our checkpoint directories,
    nothing else (a user's checkpoint-best, a *.damaged checkpoint set aside, notes: all stay)."""
    for d in our_dirs(out):
        (d / COMPLETE).unlink(missing_ok=True)  # a half-deleted checkpoint is not complete
        shutil.rmtree(d)
    for name in ("log.jsonl", "log.jsonl.tmp"):
        (out / name).unlink(missing_ok=True)


class GracefulInterrupt:
    """First Ctrl-C (SIGINT) or SIGTERM: finish the current step, checkpoint, exit with 128 + the
    signal's number (130, 143), as a process killed by it would. SIGTERM is how timeout, Slurm and
    Kubernetes stop a job (Slurm and Kubernetes then wait a grace period before SIGKILL). A second
    signal stops at once (KeyboardInterrupt for Ctrl-C, exit 143 for SIGTERM)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested, self.signum = False, None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def _handler(self, signum, frame):
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.requested, self.signum = True, signum
        name = signal.Signals(signum).name
        print(f"\n{name}: finishing this step, then saving a checkpoint (Ctrl-C or SIGTERM again to abort)",
              file=sys.stderr)

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
