"""One training run's objects and their setup, fresh or restored from a checkpoint: the data, the
model (and LoRA, FSDP2, the KL reference), AdamW, the capability tracker, the prompt sampler, the
vLLM engine, the JSONL log. train.py's loop reads them from a Run; its steps 1-4 are set there
(run.steps). Tests: tests/test_train.py, tests/test_reliability.py, tests/test_dist.py.
"""
from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import coba
from arms.knapsack_stats import WithKnapsackStats
from engines import dist, lora, tracking
from engines.checkpoint import (changed_flags, check_identity, remove_run, resume_every_rank, run_config,
                                saved_config)
from engines.rollout import VLLMGenerator
from harness.data import PromptSampler, check_candidates, data_identity, fit_prompt_length, load_data, make_sampler
from harness.evaluate import run_eval
from harness.models import device_and_amp, identity_for, load_model_and_tokenizer


# ----------------------------------------------------------------------------------------------
# What one run holds, and its setup (fresh, or restored from a checkpoint)
# ----------------------------------------------------------------------------------------------
@dataclass
class Run:
    """What the steps of one run share: the objects a checkpoint saves, and the open JSONL log."""
    args: argparse.Namespace
    out: Path
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | lora.WithoutAdapter | None  # frozen initial policy for the KL term (--beta > 0)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    tracker: WithKnapsackStats  # coba.CapabilityTracker, with Knapsack-RL's statistics beside it
    sampler: PromptSampler
    generator: VLLMGenerator | None  # --use-vllm; None: HF generate
    train_set: list[dict]
    eval_sets: dict[str, list[dict]]
    device: torch.device
    amp: object  # () -> context manager: bf16 autocast for forward passes (--bf16), else a no-op
    counters: dict  # rollouts and seconds so far (saved in checkpoints)
    log: object = None
    reporter: tracking.Tracker | None = None  # --report-to and --log-completions (engines/tracking.py)
    steps: object = None  # steps 1-4: train.PaperStep, or an arm's (arms/steps.py); set by train.py

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()  # a crash loses at most the line being written
        if self.reporter is not None:
            self.reporter.log(record)


def setup(args, out: Path, resume_from: Path | None) -> tuple[Run, int]:
    """Data, model, optimizer, tracker, sampler and log, fresh or restored from resume_from; returns
    them and the step to start at. A fresh run logs its config line and the step-0 evaluation."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device, bf16, amp = device_and_amp(args)  # amp: () -> bf16 autocast with --bf16, else a no-op
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    data_counts = {"skipped_rows": 0, "skipped_long_prompts": 0}  # logged in the config line
    train_set, eval_sets = load_data(args, data_counts)
    check_candidates(args, len(train_set))  # MoPPS's ratio x M candidates fit the pool: fail before --overwrite
    saved = saved_config(resume_from)  # the resumed run's recorded flags and identities ({}: a fresh run)
    # Recorded in the config line and every checkpoint; --resume refuses other data or another model.
    args.data_identity = data_identity(args, train_set, eval_sets)
    check_identity({"data_identity": saved.get("data_identity")}, args, resume_from)
    # fp32 master weights always; with --bf16 the forward passes run under bf16 autocast instead.
    # --use-peft: the frozen base needs no master copy (bf16 with --bf16), LoRA's weights are fp32.
    model, tokenizer, model_path = load_model_and_tokenizer(
        args, device, torch.bfloat16 if args.use_peft and bf16 else torch.float32)
    dist.broadcast_params(model)  # under torchrun: every rank starts from rank 0's weights
    dist.seed_rank(args.seed)  # ... and samples its own rollouts (rank 0 keeps --seed)
    args.model_identity = identity_for(args, model, model_path)
    if args.fsdp:  # FSDP2: each rank keeps 1/W of the weights (and so of the gradients and AdamW moments)
        model = dist.shard(model)
    if args.use_peft:
        model = lora.wrap(model, args)
    check_identity({"model_identity": saved.get("model_identity")}, args, resume_from)
    main_rank = dist.current().main  # rank 0 alone writes to OUTPUT_DIR
    if args.overwrite and main_rank:  # only now, with data and model loaded: a typo in either leaves the old run whole
        remove_run(out)
    train_set = fit_prompt_length(train_set, eval_sets, tokenizer, args, data_counts)
    # pi_ref for the k3 KL term (--beta > 0): LoRA's base under the adapter, else a frozen copy of --model
    ref_model = lora.reference_model(
        model, args, lambda: load_model_and_tokenizer(args, device, torch.bfloat16 if bf16 else torch.float32)[0])
    optimizer = make_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / args.warmup_lr_steps) if args.warmup_lr_steps else 1.0)
    # released_init: the released code's (kappa - 2, 2) before the first update (coba-released only)
    # eq. 1's p_i and eq. 4's F_t, with Knapsack-RL's own p estimate recorded beside them
    tracker = WithKnapsackStats(coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                                                       kappa=args.kappa, schedule=args.schedule_obj,
                                                       released_init=args.allocator == "coba-released"))
    run = Run(args, out, model, tokenizer, ref_model, optimizer, scheduler, tracker,
              make_sampler(args, len(train_set)), VLLMGenerator(args, model_path) if args.use_vllm else None,
              train_set, eval_sets, device, amp, counters={"rollouts": 0, "seconds": 0.0})
    start = 0
    if resume_from is not None:  # flags already checked against the saved ones (prepare_run_dir)
        resume_from, start, run.counters = resume_every_rank(out, model, optimizer, scheduler, tracker, run.sampler,
                                                             args.steps)
        if run.generator is not None:
            run.generator.sync_weights(model)
        print(f"resumed from {resume_from} at step {start}")
    open_log(run, start, resume_from, {"model_path": model_path, "device": str(device), "train_size": len(train_set),
                                       **data_counts, "world_size": dist.current().world_size})
    return run, start


def make_optimizer(model, args):
    """AdamW (paper App. C), or bitsandbytes' 8-bit AdamW to halve optimizer memory on a GPU."""
    if args.optim == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise SystemExit("error: --optim adamw8bit needs bitsandbytes (pip install bitsandbytes; "
                             "CUDA only): or use --optim adamw")
        return bnb.optim.AdamW8bit([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                                   weight_decay=0.0)
    params = [p for p in model.parameters() if p.requires_grad]  # --use-peft: LoRA's A and B only
    return torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)


def open_log(run: Run, start: int, resume_from: Path | None, config: dict) -> None:
    """OUTPUT_DIR/log.jsonl and --report-to's tracker, rank 0's (the other ranks write to devnull). A
    fresh run starts its log with the config line (its flags, and `config`) and the step-0
    evaluation; a resumed one adds a resume line: which settings made the steps from here on."""
    main_rank, log_path = dist.current().main, run.out / "log.jsonl"
    if start == 0 and main_rank:
        log_path.write_text("")
    run.log = log_path.open("a") if main_rank else open(os.devnull, "w")
    run.reporter = tracking.Tracker(run.args.report_to, run.out, start, run_config(run.args)) if main_rank else None
    if start > 0:  # --steps and speed flags may have changed on --resume (checkpoint.RESUME_MAY_CHANGE)
        run.write({"type": "resume", "step": start, "checkpoint": resume_from.name,
                   "changed": changed_flags(saved_config(resume_from), run.args)})
    if start == 0:
        run.write({"type": "config", "step": -1, **run_config(run.args), **config})
        run_eval(run, 0)
