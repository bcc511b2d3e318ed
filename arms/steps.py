"""How each arm changes steps 1-4 of one RL step (docs/arms.md): an arm is the paper's steps
(train.PaperStep) with one of them replaced; every step it does not name is the paper's.

    prompts(run, step)                     1. the M prompts
    pass_rates(run, roll)                  2. p_i of eq. 1 (PassRates)
    allocate(run, rates, alpha_t, beta_t)  3. B_i (eqs. 3-9, Algorithm 1; Allocation)
    generate(run, roll, alloc)             4. B_i rollouts of each prompt, rewarded (StepBatch)

    OracleRates  --pass-rate-source oracle (ours, a diagnostic): step 2 measures each prompt's
                 current pass rate afresh, on rollouts neither trained on nor counted
    Probe        --probe (ours): step 4 draws B_low rollouts a prompt first, allocates on them
                 pooled with the last visits, then draws the rest
    DapoRefill   --dynamic-sampling (DAPO §3.2, a baseline): steps 1-4 in blocks of uniform GRPO
                 until M groups carry signal (arms/dynamic_sampling.py); its batch (DapoBatch)
                 answers steps 5 and 8 with every generated group, the dropped ones included
    KnapsackRates  --allocator knapsack (Knapsack-RL, a baseline): step 2 also hands step 3
                 Knapsack-RL's own estimate of each prompt (arms/knapsack_stats.py), asked only here
MoPPS's prompt choice (--prompt-selection mopps) needs no step of its own: it is the run's prompt
sampler (harness/data.py), which step 1 asks for the next M prompts and whose log_fields() (its
Thompson draws) the step's record carries. train.py's rl_step and PaperStep and engines/step_data.py
name none of these arms (tests/test_layout.py).
Tests: tests/test_regime.py (the oracle), tests/test_arms.py (--probe), tests/test_arms_dapo_mopps.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import allocate
import coba
import verify
from arms import dynamic_sampling, probe
from engines import dist
from engines.rollout import merge_groups
from harness.evaluate import evaluate_inside
from engines.step_data import Allocation, PassRates, StepBatch, StepRollouts, reward_fields


def for_args(args, paper):
    """The steps 1-4 this run takes: the paper's (`paper`, a train.PaperStep), or an arm's."""
    if args.allocator == "knapsack":  # beneath the others: --probe and the oracle hand their own estimate
        paper = KnapsackRates(paper)
    if args.dynamic_sampling:
        return DapoRefill(paper)
    if args.probe:
        return Probe(paper)
    if args.pass_rate_source == "oracle":
        return OracleRates(paper)
    return paper


class _Arm:
    """An arm's steps: every step it does not define is the paper's."""

    def __init__(self, paper):
        self.paper = paper

    def __getattr__(self, name):
        if name == "paper":  # asked before __init__ set it (copy, pickle): there is none yet
            raise AttributeError(name)
        return getattr(self.paper, name)


class OracleRates(_Arm):
    def pass_rates(self, run, roll: StepRollouts) -> PassRates:
        """(ours, a diagnostic) Each prompt's *current* pass rate, p_i = successes / K over K =
        --oracle-samples fresh rollouts of the current policy, instead of the last visit's (stale by
        an epoch, from as few as B_low samples). These rollouts are never trained on and not counted
        in the run's rollouts: they are what a perfect estimate would cost, logged apart
        (oracle_rollouts, oracle_seconds). They draw from their own RNG, seeded per step, and leave
        the training RNG where it was, so the training rollouts are the ones the arm would draw
        without them. Every prompt counts as seen, Knapsack-RL gets (p, K), and the log gets the
        tracker's stale p_i beside the oracle's for comparison."""
        args, tracker = run.args, run.tracker
        M, K = len(roll.prompt_idx), args.oracle_samples
        own = StepRollouts(roll.step, roll.prompt_idx, roll.prompt_tok_m, roll.answers_m)  # own stats, kept apart
        oracle_seed = (args.seed * 1_000_003 + roll.step) * 7 + 3  # not any (step, round)'s 2 x (...) + round
        with dist.own_rng(run.device):  # this rank's device only, like the evaluation's
            torch.manual_seed(oracle_seed)
            _, rewards = self.paper.sample_and_reward(run, own, [K] * M, round_=0, seed=oracle_seed)
        p = np.array(rewards, dtype=float).reshape(M, K).mean(axis=1)  # (M,) prompt-major rows, K a prompt
        return PassRates(p, np.ones(M, dtype=bool), {
            "oracle_rollouts": M * K, "oracle_seconds": round(own.gen_seconds, 3),
            # the tracker's p_i, what coba would allocate on (None: not seen yet, the prior)
            "stale_pass_rates": [round(float(q), 4) if seen else None for q, seen in
                                 zip(tracker.pass_rates(roll.prompt_idx), tracker.seen(roll.prompt_idx))]},
            knapsack_inputs(run.args, lambda: (p, np.full(M, K))))


class Probe(_Arm):
    """(ours, not the paper) Steps 3-4 with B_low probe rollouts per prompt first. One process only
    (harness/cli.py refuses it under torchrun)."""

    def pass_rates(self, run, roll):
        return None  # known only after the probe round (generate)

    def allocate(self, run, rates, alpha_t: float, beta_t: float):
        return alpha_t, beta_t  # the allocation waits for the probe round: generate makes it

    def generate(self, run, roll: StepRollouts, alloc) -> StepBatch:
        """The probe round's outcomes pooled with the last visits are p_i (arms/probe.py);
        then only the B_i - B_low rollouts not drawn yet. Each prompt's probe rows come first in its
        group."""
        (alpha_t, beta_t), args, tracker, prompt_idx = alloc, run.args, run.tracker, roll.prompt_idx
        M, B_low = len(prompt_idx), args.min_budget
        probe_budgets = [B_low] * M
        probe_ids, probe_rewards = self.paper.sample_and_reward(run, roll, probe_budgets, round_=0)
        probe_successes = np.add.reduceat(np.array(probe_rewards), np.arange(0, M * B_low, B_low))  # (M,)
        rates = PassRates(probe.probe_pass_rates(tracker, prompt_idx, probe_successes, B_low), np.ones(M, dtype=bool),
                          allocator_inputs=knapsack_inputs(args, lambda: probe.probe_knapsack_stats(
                              tracker, prompt_idx, probe_rewards, B_low)))
        alloc = self.paper.allocate(run, rates, alpha_t, beta_t)
        rest = [B - B_low for B in alloc.budgets]
        rest_ids, rest_rewards = self.paper.sample_and_reward(run, roll, rest, round_=1)
        completion_ids = merge_groups(probe_ids, probe_budgets, rest_ids, rest)
        return StepBatch(roll, alloc, dist.Share.of(alloc.budgets), completion_ids,
                         merge_groups(probe_rewards, probe_budgets, rest_rewards, rest), [len(c) for c in completion_ids],
                         merge_groups(roll.sampler_lps[0], probe_budgets, roll.sampler_lps[1], rest))


class DapoRefill(_Arm):
    """(DAPO §3.2, a baseline) Steps 1-4 in blocks of K prompts x G rollouts (K = --gen-batch-size,
    verl's data.gen_batch_size; default M), each the next K prompts of uniform GRPO's order with
    uniform's seed for that step (at K = M, also its prompts), until M groups carry signal or the
    block limit (dynamic_sampling.dapo_rollouts). The kept groups are the batch, their p_i the
    tracker's as logged. One process only (harness/cli.py refuses it under torchrun)."""

    def prompts(self, run, step: int) -> StepRollouts:
        return StepRollouts(step, [], [], [])  # the prompts come in blocks, inside generate

    def pass_rates(self, run, roll):
        return None  # uniform blocks: no p_i is needed to generate

    def allocate(self, run, rates, alpha_t: float, beta_t: float):
        return None

    def generate(self, run, roll: StepRollouts, alloc) -> StepBatch:
        args, tracker, blocks, vstats = run.args, run.tracker, run.counters.get("blocks", 0), verify.VerifyStats()
        M = args.prompts_per_step
        K = args.gen_batch_size or M
        budgets = allocate.uniform_budgets(K, K * args.total_budget // M)  # G each (B_total = M * G; cli checks K B_total / M)

        def sample_block(b: int) -> tuple:  # block b of this update is the run's block blocks + b
            block = self.paper.prompts(run, blocks + b, K)
            block.vstats = vstats  # one count over the update's blocks
            return (block, *self.paper.sample_and_reward(run, block, budgets, round_=0))

        left = None if args.max_rollouts is None else args.max_rollouts - run.counters["rollouts"]
        dyn = dynamic_sampling.dapo_rollouts(sample_block, M, budgets, args.max_num_gen_batches, left)
        run.counters["blocks"] = blocks + dyn.blocks
        # --eval-every-rollouts points inside this update's blocks: the policy there is the one before
        # this update (the other arms spend whole steps of B_total, so theirs fall between steps)
        before = run.counters["rollouts"]
        evaluate_inside(run, roll.step, before, before + dyn.rollouts)
        kept = dyn.kept_rows()
        roll = StepRollouts(roll.step, kept["prompt_idx"], kept["prompt_tok_m"], kept["answers_m"], kept["prompts"],
                            vstats, dyn.gen_seconds)
        p = tracker.pass_rates(roll.prompt_idx)
        alloc = Allocation(p, tracker.seen(roll.prompt_idx), kept["budgets"],
                           coba.resolve_tau(args.tau, p) if len(p) else 0.0)
        return DapoBatch(roll, alloc, dist.Share.of(alloc.budgets), kept["completion_ids"], kept["rewards"],
                         [len(c) for c in kept["completion_ids"]], kept["lp_rows"], dyn)


@dataclass
class DapoBatch(StepBatch):
    """DAPO's batch: the kept groups are trained on (StepBatch's rows); what steps 5 and 8 record as
    spent is every generated group of every block, the dropped ones included (dyn)."""
    dyn: dynamic_sampling.DynamicBatch = None

    def visits(self, successes, rewards) -> tuple:
        """Every generated group as a visit, in generation order (the batch's own rows are not asked)."""
        return self.dyn.visits()

    def rollouts_spent(self) -> int:
        return self.dyn.rollouts  # every block's

    def spent_stats(self, rewards, stats) -> dict:
        """reward and reward_std over every generated rollout, then DAPO's counts (DynamicBatch.accounting)."""
        return {**reward_fields(torch.tensor(self.dyn.spent_rewards, dtype=torch.float32)), **self.dyn.accounting()}


class KnapsackRates(_Arm):
    """(Knapsack-RL, a baseline) Step 2 with Knapsack-RL's own estimate beside p_i: per prompt p_hat
    and the rollouts recorded (arms/knapsack_stats.py, recorded beside the run's tracker), what
    --allocator knapsack allocates on (arms/allocators.py)."""

    def pass_rates(self, run, roll: StepRollouts) -> PassRates:
        rates = self.paper.pass_rates(run, roll)
        rates.allocator_inputs = {"knapsack_stats": run.tracker.knapsack.stats(roll.prompt_idx)}
        return rates


def knapsack_inputs(args, stats) -> dict:
    """Step 3's keyword arguments for Knapsack-RL from an arm's own estimate (stats() -> (p_hat,
    rollouts recorded)), asked only under --allocator knapsack; {} for every other allocator."""
    return {"knapsack_stats": stats()} if args.allocator == "knapsack" else {}
