"""Train a causal LM with GRPO + CoBA-RL budget allocation, in one readable loop.

CoBA-RL (Capability-Oriented Budget Allocation, arXiv 2602.03048) keeps GRPO's total rollout
budget B_total = M * G per step but hands it out unevenly: each prompt i gets B_i rollouts chosen to
maximise sum_i V(B_i, p_i) (eq. 3), where V (eq. 9) weighs each prompt's pass rate p_i by a Beta
density whose shape follows the model's global failure rate (eqs. 4-7) and saturates in B_i (eq. 8).
rl_step below is one step, in the order of docs/method-sources.md §3, one call each:

    alpha_t, beta_t from F_bar               -> coba.CapabilityTracker.alpha_beta  (eqs. 4-7)
    1. sample M prompts                      (PaperStep.prompts: the run's prompt sampler)
    2. their pass rates p_i                  -> coba.CapabilityTracker.pass_rates  (eq. 1)
    3. allocate B_i from (p_i, alpha_t, beta_t, tau) -> allocate.py  (eqs. 3-9, Algorithm 1)
    4. generate B_i completions per prompt and reward them -> verify.rewards  (binary, RLVR)
    5. record the visits: pass rates and F_t -> coba.CapabilityTracker.update  (eqs. 1, 4)
    6. group advantages (ragged groups)      -> grpo.group_advantages
    7. clipped surrogate, optimizer steps    -> grpo.py's loss, App. C's mini-batch update
    8. log a JSONL line; evaluate; checkpoint (model, optimizer, RNG, tracker, sampler)

Steps 1-4 are the paper's (PaperStep) unless an arm replaces one of them (arms/steps.py: the
coba-oracle diagnostic's pass rates, our --probe, DAPO's refill, Knapsack-RL's estimate; docs/arms.md);
--allocator picks the rule of step 3 (arms/allocators.py). Beneath the loop, inside the generate and update calls:
generation by HF or vLLM (engines/rollout.py), LoRA (engines/lora.py), several processes under
`torchrun --nproc_per_node N train.py` (engines/dist.py: each rank generates and trains on whole
groups), exact resume (engines/checkpoint.py). The flags, presets and refusals are harness/cli.py's,
data files harness/data.py's, evaluation harness/evaluate.py's.

With no arguments it trains the tiny offline model of toy.py on CPU in a few minutes (`python
train.py`); the paper's setting on one GPU: `python train.py --model Qwen2.5-1.5B --dataset math --use-vllm`.
Tests: tests/test_train.py; the step's wiring: tests/test_step.py (the paper's arm), tests/test_arms.py
and tests/test_arms_dapo_mopps.py (the arms), tests/test_regime.py (the oracle); LoRA:
tests/test_lora.py; torchrun: tests/test_dist.py; crashes, NaNs and bad data files: tests/test_reliability.py.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

# the paper: eqs. 1, 4-9 and the tracker; the loss; the reward (Algorithm 1 is reached through
# arms/allocators.py, which picks the --allocator's rule for step 3)
import coba
import grpo
import verify
# beneath the loop
import plots
from arms import allocators
from arms import steps as arm_steps
from engines import dist, tracking
from engines.checkpoint import GracefulInterrupt, RunLock, find_checkpoint, finished_summary, nonfinite, prepare_run_dir, save_checkpoint
from engines.rollout import collate, decode, generate_groups, sampler_logps_tensor
from engines.step_data import Allocation, PassRates, StepBatch, StepRollouts  # what steps 1-4 hand on
from engines.update import policy_update  # App. C's mini-batch update (grpo.policy_update at scale)
from harness.cli import build_parser, check_launch, closing_line, progress_bars, resolve_args  # flags, refusals
from harness.data import format_prompt
from harness.evaluate import eval_due, eval_only, final_summary, run_eval  # avg@k, pass@k, greedy; --eval-only
from harness.models import default_device
from harness.run import Run, setup  # the run's objects, fresh or restored from a checkpoint


# ----------------------------------------------------------------------------------------------
# One RL step (docs/method-sources.md §3): steps 1-4 the paper's way (PaperStep; an arm replaces
# one of them, arms/steps.py), then rl_step
# ----------------------------------------------------------------------------------------------
def step_prompts(run: Run, step: int, n: int | None = None) -> StepRollouts:
    """Step 1: the next M prompts (harness/data.PromptSampler's seeded epochs, or MoPPS's choice:
    --prompt-selection), tokenised once per prompt (not per rollout). n: another count (a DAPO block)."""
    args = run.args
    prompt_idx = run.sampler.next(n or args.prompts_per_step)
    prompts = [format_prompt(run.train_set[j]["question"], run.tokenizer, args) for j in prompt_idx]
    return StepRollouts(step, prompt_idx, run.tokenizer(prompts, add_special_tokens=False)["input_ids"],
                        [run.train_set[j]["answer"] for j in prompt_idx], prompts)


def allocate_step(args, rates: PassRates, alpha_t: float, beta_t: float) -> Allocation:
    """Step 3: B_i from (p_i, alpha_t, beta_t, tau) (eqs. 3-9, Algorithm 1; or the --allocator's rule)."""
    # tau as logged: over all M prompts; "adaptive" is passed on as is, because the released
    # allocator computes it over its heap's prompts only (arms/released.py)
    tau = coba.resolve_tau(args.tau, rates.pass_rates)
    budgets = allocators.allocate_budgets(args.allocator, rates.pass_rates, rates.seen, args.total_budget,
                                          args.min_budget, args.max_budget, alpha_t, beta_t,
                                          "adaptive" if args.tau == "adaptive" else tau,
                                          solver=args.solver, **rates.allocator_inputs)
    return Allocation(rates.pass_rates, rates.seen, budgets, tau, rates.extra)


def sample_and_reward(run: Run, roll: StepRollouts, budgets: list[int], round_: int,
                      seed: int | None = None) -> tuple[list, list[float]]:
    """Step 4 for one generation round: B_i completions of prompt i, binary rewards (N,).
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


class PaperStep:
    """Steps 1-4 of one RL step the paper's way. An arm (arms/steps.py) is this with one step replaced."""

    def prompts(self, run: Run, step: int, n: int | None = None) -> StepRollouts:  # 1. M prompts
        return step_prompts(run, step, n)

    def pass_rates(self, run: Run, roll: StepRollouts) -> PassRates:
        """2. p_i from each prompt's last visits (eq. 1; the prior 0.5 if unseen)."""
        idx = roll.prompt_idx
        return PassRates(run.tracker.pass_rates(idx), run.tracker.seen(idx))

    def allocate(self, run: Run, rates: PassRates, alpha_t: float, beta_t: float) -> Allocation:  # 3. B_i
        return allocate_step(run.args, rates, alpha_t, beta_t)

    def generate(self, run: Run, roll: StepRollouts, alloc: Allocation) -> StepBatch:
        """4. B_i completions of each prompt, rewarded. Under torchrun each rank generates whole groups:
        rank 0's B_i on every rank, this rank's share of the groups, then the step's N rewards and
        completion lengths gathered from every rank in prompt-major order (dist.gather_rows): what the
        tracker, the advantages and the log read; the completions stay this rank's."""
        alloc.budgets = dist.broadcast_object(alloc.budgets)  # rank 0's: one allocation for all ranks
        share = dist.Share.of(alloc.budgets)
        completion_ids, rewards = sample_and_reward(run, roll, share.local_budgets(), round_=0)
        rewards, row_lengths = dist.gather_rows(share, rewards, [len(c) for c in completion_ids])
        return StepBatch(roll, alloc, share, completion_ids, rewards, row_lengths, roll.sampler_lps[0])

    def sample_and_reward(self, run: Run, roll: StepRollouts, budgets: list[int], round_: int,
                          seed: int | None = None) -> tuple[list, list[float]]:  # one round of step 4 (arms draw several)
        return sample_and_reward(run, roll, budgets, round_, seed)


def learn(run: Run, step: int, got: StepBatch, group_ids: torch.Tensor, advantages: torch.Tensor) -> tuple[dict, dict]:
    """Step 7: the clipped surrogate's optimizer steps (App. C's mini-batches) on this rank's rows of
    the step (all N in one process), then the sampler's weights follow. Returns (metrics, batch info).
    An empty batch (DAPO at its block limit with no group kept) makes no optimizer step: its gradient
    is zero, and AdamW's momentum alone would move the weights."""
    args, roll = run.args, got.roll
    if len(advantages) == 0:  # the step's N, not this rank's n: every rank skips together (no collective)
        return {"skipped_update": True}, {"completion_length": 0.0, "completion_tokens": 0}
    rows = got.share.rows()  # (n,) this rank's rows among the N (all of them in one process)
    ids, attn, cmask = collate([roll.prompt_tok_m[i] for i in group_ids[rows].tolist()], got.completion_ids,
                               run.tokenizer.pad_token_id)
    batch = {"input_ids": ids.to(run.device), "attention_mask": attn.to(run.device),
             "completion_mask": cmask.to(run.device), "advantages": advantages[rows].to(run.device),
             "rows": rows, "lengths": torch.tensor(got.row_lengths)}
    sampler_logps = sampler_logps_tensor(got.lp_rows, cmask.shape[1])  # (N, T); None: HF without --sampler-logps
    if sampler_logps is not None:  # vLLM's: for the gap and IS; HF generate's own: the old policy's log-probs
        hf_own = run.generator is None and args.sampler_logps
        batch["old_logps" if hf_own else "sampler_logps"] = sampler_logps.to(run.device)
    metrics = policy_update(run.model, run.optimizer, run.scheduler, batch, args, run.ref_model,
                            gen_seed=args.seed * 1_000_003 + step, autocast=run.amp)
    stop_if_nonfinite(run, step, metrics)
    if run.generator is not None:
        run.generator.sync_weights(run.model)
    return metrics, {"completion_length": float(np.mean(got.row_lengths)), "completion_tokens": int(np.sum(got.row_lengths))}


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


def rl_step(run: Run, step: int) -> dict:
    """One RL step (0-based `step`), in the order of docs/method-sources.md §3; returns its JSONL
    record. Steps 1-4 are run.steps' (the paper's, PaperStep, or an arm's: arms/steps.py)."""
    args, tracker, arm = run.args, run.tracker, run.steps
    t0 = time.time()
    alpha_t, beta_t = tracker.alpha_beta(progress=step / args.steps)  # eqs. 4-7, from F_bar so far
    roll = arm.prompts(run, step)  # 1. M prompts
    rates = arm.pass_rates(run, roll)  # 2. p_i, each prompt's pass rate (eq. 1)
    alloc = arm.allocate(run, rates, alpha_t, beta_t)  # 3. B_i (eqs. 3-9, Algorithm 1)
    got = arm.generate(run, roll, alloc)  # 4. B_i completions of prompt i, binary rewards
    roll, alloc, budgets = got.roll, got.alloc, got.alloc.budgets
    group_ids = torch.tensor([i for i, B in enumerate(budgets) for _ in range(B)], dtype=torch.long)  # (N,) prompt of each row
    rewards = torch.tensor(got.rewards, dtype=torch.float32)  # (N,)
    successes = torch.zeros(len(budgets)).index_add_(0, group_ids, rewards)  # (M,)
    # 5. record the visits: pass rates and F_t for the next allocation (eqs. 1, 4), and the prompt
    # sampler's posteriors (MoPPS); each group generated is a visit, prompt-major
    visits = got.visits(successes, rewards)
    tracker.update(*visits[:3], rewards=visits[3])
    run.sampler.record(*visits[:3])
    run.counters["rollouts"] += got.rollouts_spent()  # all ranks' N
    # 6. group advantages on ragged groups: each reward against its own prompt's B_i rewards
    advantages, adv_stats = grpo.group_advantages(rewards, group_ids, scale_std=not args.no_std_scaling)  # (N,)
    # 7. clipped surrogate, App. C's mini-batch optimizer steps
    metrics, lengths = learn(run, step, got, group_ids, advantages)
    # 8. log
    run.counters["seconds"] += time.time() - t0
    if run.reporter is not None and args.log_completions and got.completion_ids:  # a few rows to completions.jsonl
        run.reporter.log_completions(tracking.step_completions(step + 1, got, run.tokenizer, args.log_completions))
    group_reward = (successes / torch.tensor(budgets, dtype=torch.float32)).tolist()
    return {
        "type": "train", "step": step + 1, "rollouts": run.counters["rollouts"],
        "seconds": round(run.counters["seconds"], 3), "step_seconds": round(time.time() - t0, 3),
        **got.spent_stats(rewards, adv_stats),
        "F_t": tracker.history[-1], "F_bar": tracker.f_bar, "alpha_t": alpha_t, "beta_t": beta_t,
        "tau": alloc.tau, "budgets": budgets, "pass_rates": [round(float(p), 4) for p in alloc.pass_rates],
        "seen": int(np.sum(alloc.seen)), "group_reward": [round(r, 4) for r in group_reward],
        "prompt_idx": roll.prompt_idx, "lr": run.scheduler.get_last_lr()[0], **lengths, **got.share.record(),
        **run.sampler.log_fields(),  # the prompt sampler's own (MoPPS: its Thompson draws)
        **dist.over_ranks(roll), **alloc.extra, **metrics,
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
    run.steps = arm_steps.for_args(args, PaperStep())  # steps 1-4: the paper's, or an arm's
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
