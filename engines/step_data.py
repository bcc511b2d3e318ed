"""What one RL step's generation hands to the rest of the step: the M prompts (StepRollouts), the
allocation as the allocator saw it (Allocation), and the rollouts with their rewards (StepBatch),
whichever arm made them (train.PaperStep, or an arm of arms/steps.py).

StepBatch also answers, for steps 5 and 8, what the step *spent*: the visits the tracker records
(each generated group of B_i rollouts is one visit of its prompt, eq. 1), the rollouts counted
against the budget, and the log's reward fields. For the paper's arm that is the batch itself; an
arm that spends more than it trains on answers with its own subclass (DAPO's refill: every generated
group, the dropped ones included; arms/steps.py DapoBatch). Nothing here names an arm
(tests/test_layout.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import verify
from engines import dist


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
class PassRates:
    """Step 2's answer: p_i (eq. 1) and whether prompt i was seen before, an arm's own log fields
    (the oracle's), and what the --allocator's rule reads beside them (Knapsack-RL: its own estimate,
    arms/steps.py KnapsackRates): keyword arguments of arms/allocators.allocate_budgets."""
    pass_rates: np.ndarray  # (M,)
    seen: np.ndarray  # (M,) bool
    extra: dict = field(default_factory=dict)
    allocator_inputs: dict = field(default_factory=dict)


@dataclass
class Allocation:
    """Step 3's inputs and answer, as logged: p_i and seen_i as the allocator saw them, B_i, tau."""
    pass_rates: np.ndarray  # (M,)
    seen: np.ndarray  # (M,) bool
    budgets: list[int]  # (M,) B_i, sum B_total
    tau: float  # eq. 8's tau over all M prompts
    extra: dict = field(default_factory=dict)  # the pass rates' own log fields (PassRates.extra)


@dataclass
class StepBatch:
    """Steps 1-4's answer, whichever arm made it: what steps 5-8 read."""
    roll: StepRollouts  # the M prompts (DAPO: the kept groups' prompts)
    alloc: Allocation  # p_i and seen_i as the allocator saw them, B_i, tau
    share: dist.Share  # the groups this rank generated and trains on (all of them in one process)
    completion_ids: list[list[int]]  # this rank's rows, prompt-major
    rewards: list[float]  # (N,) every rank's rows' rewards, prompt-major
    row_lengths: list[int]  # (N,) every row's completion length
    lp_rows: list  # this rank's rows' sampler log-probs (HF without --sampler-logps: None each)

    def visits(self, successes: torch.Tensor, rewards: torch.Tensor) -> tuple:
        """Step 5's visits, prompt-major: (prompt ids, successes, B_i, each group's rewards)."""
        budgets = self.alloc.budgets
        return self.roll.prompt_idx, successes.tolist(), budgets, [r.tolist() for r in rewards.split(budgets)]

    def rollouts_spent(self) -> int:
        """Rollouts this step counts against the run's budget (every rank's N)."""
        return len(self.rewards)

    def spent_stats(self, rewards: torch.Tensor, stats: dict) -> dict:
        """The log's reward and zero-signal fields over every rollout this step spent: the batch
        (stats: grpo.group_advantages' over it)."""
        n_groups = stats["num_groups"]
        return {**reward_fields(rewards), "frac_reward_zero_std": stats["zero_signal_groups"] / n_groups,
                "zero_signal_groups": stats["zero_signal_groups"], "zero_signal_rollouts": stats["zero_signal_rollouts"],
                "step_rollouts": len(rewards), "step_groups": n_groups}


def reward_fields(rewards: torch.Tensor) -> dict:
    """The log's reward and reward_std over the rollouts a step spent (N,)."""
    return {"reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0}
