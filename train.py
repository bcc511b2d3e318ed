"""Train a causal LM with GRPO + CoBA-RL budget allocation, in one readable loop.

CoBA-RL (Capability-Oriented Budget Allocation, arXiv 2602.03048) keeps GRPO's total rollout
budget B_total = M * G per step but hands it out unevenly: each prompt i gets B_i rollouts chosen to
maximise sum_i V(B_i, p_i) (eq. 3), where V (eq. 9) weighs each prompt's pass rate p_i by a Beta
density whose shape follows the model's global failure rate (eqs. 4-7) and saturates in B_i (eq. 8).
One step of the loop below, in the order of docs/method-sources.md §3:

    1. sample M prompts                     (data.PromptSampler)
    2. allocate B_i from (p_i, alpha_t, beta_t, tau)   -> allocate.allocate_budgets  (Algorithm 1)
    3. generate B_i completions per prompt  (engines/rollout.py: HF generate; vLLM on GPU)
    4. reward each completion               -> verify.rewards  (binary, RLVR)
    5. update pass rates and F_t            -> coba.CapabilityTracker.update  (eqs. 1, 4)
    6. group advantages (ragged groups)     -> grpo.group_advantages
    7. clipped surrogate, optimizer steps   -> grpo.per_token_logps, grpo.clipped_policy_loss
    8. log a JSONL line; evaluate; checkpoint (model, optimizer, RNG, tracker, sampler)

With no arguments it trains the tiny offline model of toy.py on CPU in a few minutes (`python
train.py`); the paper's setting on one GPU: `python train.py --model Qwen2.5-1.5B --dataset math --use-vllm`.
rl_step below is that one step, one call per step of the list; each arm beside the paper's is one
call behind its name (docs/arms.md): DAPO's refill (--dynamic-sampling: dapo_rollouts; its blocks and
accounting in arms/dynamic_sampling.py), our in-step probe (--probe: probe_then_allocate), MoPPS's prompt
choice (--prompt-selection mopps: run.sampler) and the coba-oracle diagnostic (--pass-rate-source
oracle: oracle_pass_rates). App. C's mini-batch update is grpo.policy_update. Kept out of this file:
evaluation the paper's way and --eval-only (harness/evaluate.py); the flags, presets and every refusal
(harness/cli.py); data files (harness/data.py); safe stop and exact resume (engines/checkpoint.py); LoRA and its KL reference
(--use-peft: engines/lora.py); everything of several processes (`torchrun --nproc_per_node N train.py`,
engines/dist.py), which shows here as one Share per step (the whole groups this rank generates and trains
on), the gather after generation (the tracker, advantages and log see the whole step on every rank)
and this rank's micro-batches of each mini-batch; --fsdp shards the model (engines/dist.py's three rules).
Left out on purpose: DeepSpeed, sharded checkpoint files (torch.distributed.checkpoint), async rollouts.
Tests: tests/test_train.py; each step's wiring: tests/test_step.py (the paper's arm), tests/test_arms.py
(knapsack, coba-released, --probe), tests/test_arms_dapo_mopps.py (dapo, mopps, mopps+coba),
tests/test_regime.py (the oracle); LoRA: tests/test_lora.py; torchrun: tests/test_dist.py; crashes,
NaNs, a second run and bad data files: tests/test_reliability.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import allocate
import coba
from engines import dist
from arms import dynamic_sampling
import grpo
from engines import lora
import plots
from engines import tracking
import verify
from engines.checkpoint import (GracefulInterrupt, RunLock, changed_flags, check_identity, find_checkpoint, finished_summary,
                        nonfinite, prepare_run_dir, remove_run, resume_every_rank, run_config, save_checkpoint,
                        saved_config)
from harness.cli import (build_parser, check_launch, closing_line, progress_bars,  # the command line: flags, presets,
                 resolve_args)  # range checks and refusals, and what it prints at the end
from harness.data import PromptSampler, check_candidates, data_identity, fit_prompt_length, format_prompt, load_data, make_sampler
from harness.evaluate import eval_due, eval_only, evaluate_inside, final_summary, run_eval  # avg@k, pass@k, greedy; --eval-only
from grpo import policy_update  # App. C's mini-batch update: the clipped surrogate's optimizer steps
from harness.models import default_device, device_and_amp, identity_for, load_model_and_tokenizer
from engines.rollout import VLLMGenerator, collate, decode, generate_groups, merge_groups, sampler_logps_tensor


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
    tracker: coba.CapabilityTracker
    sampler: PromptSampler
    generator: VLLMGenerator | None  # --use-vllm; None: HF generate
    train_set: list[dict]
    eval_sets: dict[str, list[dict]]
    device: torch.device
    amp: object  # () -> context manager: bf16 autocast for forward passes (--bf16), else a no-op
    counters: dict  # rollouts and seconds so far (saved in checkpoints)
    log: object = None
    reporter: tracking.Tracker | None = None  # --report-to and --log-completions (engines/tracking.py)

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()  # a crash loses at most the line being written
        if self.reporter is not None:
            self.reporter.log(record)


@dataclass
class StepRollouts:
    """One step's M prompts and what its generation rounds gave (one round; two with --probe)."""
    step: int
    prompt_idx: list[int]  # (M,) dataset index of each prompt
    prompt_tok_m: list[list[int]]  # M prompts tokenised once (not per rollout): generation and loss
    answers_m: list[str]  # (M,) reference answers
    prompts: list[str] = field(default_factory=list)  # (M,) formatted prompts (--log-completions)
    vstats: verify.VerifyStats = field(default_factory=verify.VerifyStats)
    gen_seconds: float = 0.0
    sampler_lps: dict = field(default_factory=dict)  # round -> per row, vLLM's log-prob of each token (HF: None)


@dataclass
class Allocation:
    """Step 2's inputs and answer, as logged: p_i and seen_i as the allocator saw them, B_i, tau."""
    pass_rates: np.ndarray  # (M,)
    seen: np.ndarray  # (M,) bool
    budgets: list[int]  # (M,) B_i, sum B_total
    tau: float  # eq. 8's tau over all M prompts


@dataclass
class StepBatch:
    """Steps 1-4's answer, whichever arm made it (the paper's, --probe, DAPO's): what steps 5-8 read."""
    roll: StepRollouts  # the M prompts (DAPO: the kept groups' prompts)
    alloc: Allocation  # p_i and seen_i as the allocator saw them, B_i, tau
    share: dist.Share  # the groups this rank generated and trains on (all of them in one process)
    completion_ids: list[list[int]]  # this rank's rows, prompt-major
    rewards: list[float]  # (N,) every rank's rows' rewards, prompt-major
    row_lengths: list[int]  # (N,) every row's completion length
    lp_rows: list  # this rank's rows' sampler log-probs (HF without --sampler-logps: None each)
    dapo: dynamic_sampling.DynamicBatch | None = None  # --dynamic-sampling: every generated group, the accounting
    extra: dict = field(default_factory=dict)  # an arm's own log fields (--pass-rate-source oracle)


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
    tracker = coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                                     kappa=args.kappa, schedule=args.schedule_obj,
                                     released_init=args.allocator == "coba-released")
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


# ----------------------------------------------------------------------------------------------
# One RL step (docs/method-sources.md §3): steps 1-4 the paper's way or an arm's, then rl_step
# ----------------------------------------------------------------------------------------------
def step_prompts(run: Run, step: int, n: int | None = None) -> StepRollouts:
    """Step 1: the next M prompts (data.PromptSampler's seeded epochs, or MoPPS's choice:
    --prompt-selection), tokenised once per prompt (not per rollout). n: another count (a DAPO block)."""
    args = run.args
    prompt_idx = run.sampler.next(n or args.prompts_per_step)
    prompts = [format_prompt(run.train_set[j]["question"], run.tokenizer, args) for j in prompt_idx]
    return StepRollouts(step, prompt_idx, run.tokenizer(prompts, add_special_tokens=False)["input_ids"],
                        [run.train_set[j]["answer"] for j in prompt_idx], prompts)


def step_pass_rates(run: Run, roll: StepRollouts) -> tuple[np.ndarray, np.ndarray, tuple, dict]:
    """Step 2's inputs: (p_i, seen_i, Knapsack-RL's (p_hat, rollouts recorded), log fields). The
    paper's p_i are the tracker's, from the last visits (eq. 1); with --pass-rate-source oracle
    (ours, a diagnostic) they are the current policy's, measured afresh (oracle_pass_rates)."""
    if run.args.pass_rate_source == "oracle":
        return oracle_pass_rates(run, roll)
    idx = roll.prompt_idx
    return run.tracker.pass_rates(idx), run.tracker.seen(idx), run.tracker.knapsack_stats(idx), {}


def oracle_pass_rates(run: Run, roll: StepRollouts) -> tuple[np.ndarray, np.ndarray, tuple, dict]:
    """(ours, a diagnostic: --pass-rate-source oracle, issue 42) Each prompt's *current* pass rate,
    p_i = successes / K over K = --oracle-samples fresh rollouts of the current policy, instead of the
    last visit's (stale by an epoch, from as few as B_low samples). These rollouts are never trained on
    and not counted in the run's rollouts: they are what a perfect estimate would cost, logged apart
    (oracle_rollouts, oracle_seconds). They draw from their own RNG, seeded per step, and leave the
    training RNG where it was, so the training rollouts are the ones the arm would draw without them.
    Returns step_pass_rates' four: every prompt counts as seen, Knapsack-RL gets (p, K), and the log
    gets the tracker's stale p_i beside the oracle's for comparison."""
    args, tracker = run.args, run.tracker
    M, K = len(roll.prompt_idx), args.oracle_samples
    own = StepRollouts(roll.step, roll.prompt_idx, roll.prompt_tok_m, roll.answers_m)  # own stats, kept apart
    oracle_seed = (args.seed * 1_000_003 + roll.step) * 7 + 3  # not any (step, round)'s 2 x (...) + round
    with dist.own_rng(run.device):  # this rank's device only, like the evaluation's
        torch.manual_seed(oracle_seed)
        _, rewards = sample_and_reward(run, own, [K] * M, round_=0, seed=oracle_seed)
    p = np.array(rewards, dtype=float).reshape(M, K).mean(axis=1)  # (M,) prompt-major rows, K a prompt
    return p, np.ones(M, dtype=bool), (p, np.full(M, K)), {
        "oracle_rollouts": M * K, "oracle_seconds": round(own.gen_seconds, 3),
        # the tracker's p_i, what coba would allocate on (None: not seen yet, the prior)
        "stale_pass_rates": [round(float(q), 4) if seen else None for q, seen in
                             zip(tracker.pass_rates(roll.prompt_idx), tracker.seen(roll.prompt_idx))]}


def allocate_step(args, pass_rates, seen, knapsack_stats, alpha_t: float, beta_t: float) -> Allocation:
    """Step 2: B_i from (p_i, alpha_t, beta_t, tau) (eqs. 3-9, Algorithm 1; or the --allocator's rule)."""
    # tau as logged: over all M prompts; "adaptive" is passed on as is, because the released
    # allocator computes it over its heap's prompts only (allocate.allocate_released)
    tau = coba.resolve_tau(args.tau, pass_rates)
    budgets = allocate.allocate_budgets(args.allocator, pass_rates, seen, args.total_budget,
                                        args.min_budget, args.max_budget, alpha_t, beta_t,
                                        "adaptive" if args.tau == "adaptive" else tau,
                                        solver=args.solver, knapsack_stats=knapsack_stats)
    return Allocation(pass_rates, seen, budgets, tau)


def sample_share(run: Run, roll: StepRollouts, alloc: Allocation, extra: dict) -> StepBatch:
    """Steps 3-4 on this rank's whole groups (all of them in one process): rank 0's B_i on every rank,
    B_i completions of each of its prompts, their rewards. The step's N rewards and completion lengths
    are gathered from every rank in prompt-major order (dist.gather_rows): what the tracker, the
    advantages and the log read; the completions stay this rank's."""
    alloc.budgets = dist.broadcast_object(alloc.budgets)  # rank 0's: one allocation for all ranks
    share = dist.Share.of(alloc.budgets)
    completion_ids, rewards = sample_and_reward(run, roll, share.local_budgets(), round_=0)
    rewards, row_lengths = dist.gather_rows(share, rewards, [len(c) for c in completion_ids])
    return StepBatch(roll, alloc, share, completion_ids, rewards, row_lengths, roll.sampler_lps[0], extra=extra)


def sample_and_reward(run: Run, roll: StepRollouts, budgets: list[int], round_: int,
                      seed: int | None = None) -> tuple[list, list[float]]:
    """Steps 3-4 for one generation round: B_i completions of prompt i, binary rewards (N,).
    seed (vLLM's request seeds; HF draws from the global torch RNG): by default one per (step, round)."""
    args = run.args
    t_gen = time.time()
    with run.amp(), dist.gathered(run.model):  # --fsdp: whole weights while decoding (engines/dist.py rule 1)
        completions = generate_groups(
            run.model, run.tokenizer, roll.prompt_tok_m, budgets, max_new_tokens=args.max_completion_length,
            temperature=args.temperature, top_p=args.top_p, batch_size=args.generation_batch_size,
            generator=run.generator, seed=2 * (args.seed * 1_000_003 + roll.step) + round_ if seed is None else seed,
            logprobs_out=roll.sampler_lps.setdefault(round_, []), hf_logprobs=args.sampler_logps,
            share_prompt_prefill=args.shared_prompt_prefill)
    roll.gen_seconds += time.time() - t_gen
    answers = [a for a, B in zip(roll.answers_m, budgets) for _ in range(B)]
    return completions, verify.rewards(decode(run.tokenizer, completions), answers,
                                       last_number_fallback=args.last_number_fallback, stats=roll.vstats)


def probe_then_allocate(run: Run, roll: StepRollouts, alpha_t: float, beta_t: float) -> StepBatch:
    """Steps 2-4 with --probe (ours): B_low rollouts per prompt first, their outcomes pooled with the
    last visits as p_i (coba.probe_pass_rates), then only the B_i - B_low rollouts not drawn yet; each
    prompt's probe rows come first in its group. One process only (cli refuses it under torchrun)."""
    args, tracker, prompt_idx = run.args, run.tracker, roll.prompt_idx
    M, B_low = len(prompt_idx), args.min_budget
    probe_budgets = [B_low] * M
    probe_ids, probe_rewards = sample_and_reward(run, roll, probe_budgets, round_=0)
    probe_successes = np.add.reduceat(np.array(probe_rewards), np.arange(0, M * B_low, B_low))  # (M,)
    alloc = allocate_step(args, coba.probe_pass_rates(tracker, prompt_idx, probe_successes, B_low),
                          np.ones(M, dtype=bool), coba.probe_knapsack_stats(tracker, prompt_idx, probe_rewards, B_low),
                          alpha_t, beta_t)
    rest = [B - B_low for B in alloc.budgets]
    rest_ids, rest_rewards = sample_and_reward(run, roll, rest, round_=1)
    completion_ids = merge_groups(probe_ids, probe_budgets, rest_ids, rest)
    return StepBatch(roll, alloc, dist.Share.of(alloc.budgets), completion_ids,
                     merge_groups(probe_rewards, probe_budgets, rest_rewards, rest), [len(c) for c in completion_ids],
                     merge_groups(roll.sampler_lps[0], probe_budgets, roll.sampler_lps[1], rest))


def dapo_rollouts(run: Run, step: int) -> StepBatch:
    """Steps 1-4 with --dynamic-sampling (DAPO §3.2, a baseline): blocks of K prompts x G rollouts (K =
    --gen-batch-size, verl's data.gen_batch_size; default M), each the next K prompts of uniform GRPO's
    order with uniform's seed for that step (at K = M, also its prompts), until M groups carry signal or
    the block limit (dynamic_sampling.dapo_rollouts). The kept groups are the batch, their p_i the
    tracker's as logged. One process only (cli refuses it under torchrun)."""
    args, tracker, blocks, vstats = run.args, run.tracker, run.counters.get("blocks", 0), verify.VerifyStats()
    M = args.prompts_per_step
    K = args.gen_batch_size or M
    budgets = allocate.uniform_budgets(K, K * args.total_budget // M)  # G each (B_total = M * G; cli checks K B_total / M)

    def sample_block(b: int) -> tuple:  # block b of this update is the run's block blocks + b
        roll = step_prompts(run, blocks + b, K)
        roll.vstats = vstats  # one count over the update's blocks
        return (roll, *sample_and_reward(run, roll, budgets, round_=0))

    left = None if args.max_rollouts is None else args.max_rollouts - run.counters["rollouts"]
    dyn = dynamic_sampling.dapo_rollouts(sample_block, M, budgets, args.max_num_gen_batches, left)
    run.counters["blocks"] = blocks + dyn.blocks
    kept = dyn.kept_rows()
    roll = StepRollouts(step, kept["prompt_idx"], kept["prompt_tok_m"], kept["answers_m"], kept["prompts"], vstats,
                        dyn.gen_seconds)
    p = tracker.pass_rates(roll.prompt_idx)
    alloc = Allocation(p, tracker.seen(roll.prompt_idx), kept["budgets"], coba.resolve_tau(args.tau, p) if len(p) else 0.0)
    return StepBatch(roll, alloc, dist.Share.of(alloc.budgets), kept["completion_ids"], kept["rewards"],
                     [len(c) for c in kept["completion_ids"]], kept["lp_rows"], dapo=dyn)


def learn(run: Run, step: int, roll: StepRollouts, completion_ids, rewards, group_ids, lp_rows,
          share: dist.Share, row_lengths: list[int]) -> tuple[dict, dict, dict]:
    """Steps 6-7: group advantages on ragged groups, then the clipped surrogate's optimizer steps.
    Returns (metrics, batch info, the advantages' group stats). An empty batch (DAPO at its block limit with no group kept)
    makes no optimizer step: its gradient is zero, and AdamW's momentum alone would move the weights.
    rewards and group_ids are the step's N rows (every rank's); completion_ids and lp_rows this rank's
    own rows, share.rows() (all N in one process); row_lengths (N,) every row's completion length."""
    args = run.args
    if len(rewards) == 0:  # the step's N, not this rank's n: every rank skips together (no collective)
        return {"skipped_update": True}, {"completion_length": 0.0, "completion_tokens": 0}, {}
    advantages, adv_stats = grpo.group_advantages(rewards, group_ids, scale_std=not args.no_std_scaling)  # (N,)
    rows = share.rows()  # (n,) this rank's rows among the N (all of them in one process)
    ids, attn, cmask = collate([roll.prompt_tok_m[i] for i in group_ids[rows].tolist()], completion_ids,
                               run.tokenizer.pad_token_id)
    batch = {"input_ids": ids.to(run.device), "attention_mask": attn.to(run.device),
             "completion_mask": cmask.to(run.device), "advantages": advantages[rows].to(run.device),
             "rows": rows, "lengths": torch.tensor(row_lengths)}
    sampler_logps = sampler_logps_tensor(lp_rows, cmask.shape[1])  # (N, T); None: HF without --sampler-logps
    if sampler_logps is not None:  # vLLM's: for the gap and IS; HF generate's own: the old policy's log-probs
        hf_own = run.generator is None and args.sampler_logps
        batch["old_logps" if hf_own else "sampler_logps"] = sampler_logps.to(run.device)
    metrics = policy_update(run.model, run.optimizer, run.scheduler, batch, args, run.ref_model,
                            gen_seed=args.seed * 1_000_003 + step, autocast=run.amp)
    stop_if_nonfinite(run, step, metrics)
    if run.generator is not None:
        run.generator.sync_weights(run.model)
    return (metrics, {"completion_length": float(np.mean(row_lengths)), "completion_tokens": int(np.sum(row_lengths))},
            adv_stats)


def stop_if_nonfinite(run: Run, step: int, metrics: dict) -> None:
    """Stop before a NaN/inf state can reach a checkpoint: the last one saved stays finite."""
    bad = nonfinite(metrics, run.model)
    if bad:
        last = find_checkpoint(run.out)
        kept = f"{last.name} is finite and kept" if last else "no checkpoint was saved yet"
        message = (f"step {step + 1} made the {', '.join(bad)} non-finite (NaN/inf); {kept}: lower "
                   f"--learning-rate ({run.args.learning_rate}) and start again with --overwrite")
        run.write({"type": "error", "step": step + 1, "error": message, "nonfinite": bad})
        run.log.close()
        raise SystemExit(f"error: {message}")


def spent_stats(got: StepBatch, rewards: torch.Tensor, stats: dict) -> dict:
    """The log's reward and zero-signal fields over every rollout this step spent: the batch
    (stats: grpo.group_advantages' over it), or with DAPO every generated group, dropped ones
    included, with DAPO's own counts (dynamic_sampling.DynamicBatch.accounting)."""
    if got.dapo is not None:
        rewards = torch.tensor(got.dapo.spent_rewards, dtype=torch.float32)
    spent = {"reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0}
    if got.dapo is not None:
        return {**spent, **got.dapo.accounting()}
    n_groups = stats["num_groups"]
    return {**spent, "frac_reward_zero_std": stats["zero_signal_groups"] / n_groups,
            "zero_signal_groups": stats["zero_signal_groups"], "zero_signal_rollouts": stats["zero_signal_rollouts"],
            "step_rollouts": len(rewards), "step_groups": n_groups}


def rl_step(run: Run, step: int) -> dict:
    """One RL step (0-based `step`), in the order of docs/method-sources.md §3; returns its JSONL record. Steps 1-4
    are the paper's or an arm's (one call each): DAPO's refill, our --probe; MoPPS draws the prompts
    (run.sampler), and the coba-oracle diagnostic the pass rates (step_pass_rates)."""
    args, tracker = run.args, run.tracker
    t0, before = time.time(), run.counters["rollouts"]
    alpha_t, beta_t = tracker.alpha_beta(progress=step / args.steps)
    if args.dynamic_sampling:  # DAPO's arm (a baseline): steps 1-4 in blocks until M groups carry signal
        got = dapo_rollouts(run, step)
    else:
        # 1. sample M prompts (the seed's order, or MoPPS's Thompson draws: --prompt-selection mopps)
        roll = step_prompts(run, step)
        if args.probe:  # (ours, not the paper) steps 2-4 with B_low probe rollouts per prompt first
            got = probe_then_allocate(run, roll, alpha_t, beta_t)
        else:
            # 2. allocate B_i from p_i (the last visits'; the oracle's: --pass-rate-source), alpha_t, beta_t (eqs. 3-9)
            pass_rates, seen, knapsack_stats, extra = step_pass_rates(run, roll)
            alloc = allocate_step(args, pass_rates, seen, knapsack_stats, alpha_t, beta_t)
            # 3.-4. generate B_i completions for prompt i and reward them (under torchrun: this rank's groups)
            got = sample_share(run, roll, alloc, extra)
    roll, alloc, budgets = got.roll, got.alloc, got.alloc.budgets
    group_ids = torch.tensor([i for i, B in enumerate(budgets) for _ in range(B)], dtype=torch.long)  # (N,) prompt of each row
    rewards = torch.tensor(got.rewards, dtype=torch.float32)  # (N,)
    successes = torch.zeros(len(budgets)).index_add_(0, group_ids, rewards)  # (M,)
    # 5. update the tracker (pass rates and F_t for the next allocation, eqs. 1, 4) and MoPPS's posteriors:
    # each group generated is a visit, prompt-major (Knapsack-RL's p_hat reads them in order); with DAPO
    # every generated group, the dropped ones too, in generation order
    visits = got.dapo.visits() if got.dapo is not None else (
        roll.prompt_idx, successes.tolist(), budgets, [r.tolist() for r in rewards.split(budgets)])
    tracker.update(*visits[:3], rewards=visits[3])
    run.sampler.record(*visits[:3])
    run.counters["rollouts"] += got.dapo.rollouts if got.dapo is not None else len(got.rewards)  # all ranks' N
    evaluate_inside(run, step, before, run.counters["rollouts"])
    # 6.-7. group advantages on ragged groups; clipped surrogate, mini-batch optimizer steps
    metrics, lengths, adv_stats = learn(run, step, roll, got.completion_ids, rewards, group_ids, got.lp_rows,
                                        got.share, got.row_lengths)
    # 8. log
    run.counters["seconds"] += time.time() - t0
    if run.reporter is not None and args.log_completions and got.completion_ids:  # a few rows to completions.jsonl
        run.reporter.log_completions(tracking.step_completions(step + 1, got, run.tokenizer, args.log_completions))
    group_reward = (successes / torch.tensor(budgets, dtype=torch.float32)).tolist()
    theta = getattr(run.sampler, "last_draws", None)  # MoPPS: the chosen prompts' Thompson draws
    return {
        "type": "train", "step": step + 1, "rollouts": run.counters["rollouts"],
        "seconds": round(run.counters["seconds"], 3), "step_seconds": round(time.time() - t0, 3),
        **spent_stats(got, rewards, adv_stats),
        "F_t": tracker.history[-1], "F_bar": tracker.f_bar, "alpha_t": alpha_t, "beta_t": beta_t,
        "tau": alloc.tau, "budgets": budgets, "pass_rates": [round(float(p), 4) for p in alloc.pass_rates],
        "seen": int(np.sum(alloc.seen)), "group_reward": [round(r, 4) for r in group_reward],
        "prompt_idx": roll.prompt_idx, "lr": run.scheduler.get_last_lr()[0], **lengths, **got.share.record(),
        **({"mopps_theta": [round(t, 4) for t in theta]} if theta is not None else {}),
        **dist.over_ranks(roll), **got.extra, **metrics,
    }


# ----------------------------------------------------------------------------------------------
# The run: rl_step once per step, evaluating and checkpointing between steps; main
# ----------------------------------------------------------------------------------------------
def train(args) -> dict:
    """Run the whole job in OUTPUT_DIR, locked against a second run meanwhile; returns the summary
    dict (also the last line of the JSONL log)."""
    out = Path(args.output_dir)  # a folder, not empty, no symlinked run file (cli.check_path_flags)
    out.mkdir(parents=True, exist_ok=True)
    main_rank = dist.current().main  # under torchrun rank 0 holds the lock and settles OUTPUT_DIR for all
    with RunLock(out) if main_rank else contextlib.nullcontext(), progress_bars(not args.no_progress):
        resume_from = dist.on_rank0(prepare_run_dir, out, args)
        summary = dist.on_rank0(finished_summary, out, resume_from, args)
        if summary is not None:  # resuming a finished run: nothing to add (a larger --steps extends it)
            print(f"{out}: the run already finished at step {summary['step']}; pass a larger --steps "
                  f"(or --max-rollouts) to extend it")
            return summary
        return run_training(args, out, resume_from)


def budget_spent(args, counters: dict) -> bool:
    """--max-rollouts (equal rollouts across arms): no rollouts left for another update."""
    return args.max_rollouts is not None and counters["rollouts"] >= args.max_rollouts


def run_training(args, out: Path, resume_from: Path | None) -> dict:
    """train()'s body: setup, rl_step for each step (evaluating and checkpointing between steps),
    the final evaluation and summary."""
    from tqdm.auto import tqdm

    run, start = setup(args, out, resume_from)
    bar = tqdm(range(start, args.steps), desc=f"{args.allocator} RL", disable=args.no_progress,
               initial=start, total=args.steps)
    done = start
    with GracefulInterrupt() as interrupt:
        for step in bar:
            if budget_spent(args, run.counters):  # --max-rollouts: ends on rollouts, before --steps
                break
            record = rl_step(run, step)
            run.write(record)
            bar.set_postfix(reward=f"{record['reward']:.3f}", F=f"{record['F_t']:.2f}", a=f"{record['alpha_t']:.2f}")
            done = step + 1
            finished = done == args.steps or budget_spent(args, run.counters)
            if not finished and eval_due(args, done, run.counters["rollouts"]):  # (the last one: below)
                run_eval(run, done)
            if dist.any_rank(interrupt.requested) and not interrupt.requested:  # another rank's signal
                interrupt.requested, interrupt.signum = True, signal.SIGTERM
            if done % args.save_every == 0 or finished or interrupt.requested:
                saved = save_checkpoint(out, done, run.model, run.tokenizer, run.optimizer, run.scheduler,
                                        run.tracker, run.sampler, args, run.counters, run_end=finished)
            if interrupt.requested:  # main exits 130 (Ctrl-C) or 143 (SIGTERM): the run did not finish
                print(f"stopped after step {done}; checkpoint in {saved}; continue with --resume", file=sys.stderr)
                run.log.close()
                return {"interrupted": True, "step": done, "exit_code": interrupt.exit_code}
    summary = final_summary(run, done)  # the final evaluation, and the first and final accuracies
    run.write(summary)
    run.log.close()
    if dist.current().main:
        run.reporter.close()
        plots.plot_run_safely(out)  # OUTPUT_DIR/plots/*.png (plots.py; also `python plots.py OUTPUT_DIR`)
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = resolve_args(ap.parse_args(argv), ap)
    t0 = time.time()
    check_launch(args)  # what torchrun's processes do not run (yet): one line, before any process group
    ranks = dist.init(default_device(args.device))
    if not ranks.main:  # one set of progress bars: rank 0's
        args.no_progress = True
    try:
        return finish(args, t0) if not args.eval_only else eval_only(args)
    finally:
        dist.teardown()


def finish(args, t0: float) -> dict:
    """main's end: train, then the closing line (rank 0)."""
    summary = train(args)
    if summary.get("interrupted"):  # after its checkpoint: exit as a process stopped by the signal would
        raise SystemExit(summary["exit_code"])
    line = closing_line(summary, args.eval_samples)
    if line is not None and dist.current().main:
        print(f"{line} after {summary['rollouts']} rollouts; wall time {time.time() - t0:.0f} s; log: "
              f"{Path(args.output_dir) / 'log.jsonl'}")
    return summary


if __name__ == "__main__":
    main()
