"""Knapsack-RL (Li et al. 2025, arXiv 2509.25849), the `--allocator knapsack` arm (docs/arms.md):
its value, its per-prompt statistics and its published allocator.

liziniu/KnapsackRL: the allocator is `verl/trainer/ppo/exploration_utils.py`
`sampling_budget_by_knapsack` + `solve_by_dp`, the p estimate `verl/utils/dataset/rl_dataset.py`.
Eq. 3's constraints are allocate.py's. Where the official code breaks and what we do instead:
docs/method-sources.md §4. Tests: tests/test_allocators.py, tests/test_coba.py (value, statistics).

    knapsack_value      Value(N, p) = (1 - p^N - (1-p)^N) p (1-p)^2
    KnapsackStats       per prompt: rollouts recorded, p_hat, the last 16 rewards (arms/knapsack_stats.py,
                        imported here; coba.CapabilityTracker keeps one)
    knapsack_cost_cap   a prompt's cost cap: the rollouts after which its group is all-equal
                        with probability <= 0.1
    allocate_knapsack   the allocation: validity, B_low, the cap, the fallback, the knapsack
    _knapsack_units     its step 4, the exact knapsack over the informative prompts
"""
from __future__ import annotations

import numpy as np

from allocate import allocate_dp, as_int, check_feasible, check_pass_rates, uniform_budgets
from speedups.lazy_heap import allocate_lazy
from speedups.threshold import fill_evenly
from arms.knapsack_stats import KNAPSACK_BUFFER, KnapsackStats  # noqa: F401  (its p estimate, recorded beside coba's tracker)


# ----------------------------------------------------------------------------------------------
# Knapsack-RL's value (its statistics: arms/knapsack_stats.py)
# ----------------------------------------------------------------------------------------------
def knapsack_value(budget, p):
    """Knapsack-RL (docs/method-sources.md §4): Value(N, p) = (1 - p^N - (1-p)^N) * p (1-p)^2.

    First factor: probability that N rollouts are not all equal, i.e. the group has a non-zero
    GRPO gradient. Second: an information-gain term peaking at p = 1/3. Zero at p in {0, 1}. The
    first factor is clipped at 0 (B = 0 would give -1 since 0^0 = 1; ours). budget, p broadcast.
    """
    N, p = np.asarray(budget, dtype=float), np.asarray(p, dtype=float)
    nonzero_grad = np.maximum(0.0, 1.0 - p ** N - (1.0 - p) ** N)
    V = np.asarray(nonzero_grad * p * (1.0 - p) ** 2, dtype=float)
    return float(V) if V.ndim == 0 else V  # 0-d back to a Python float (JSON-friendly logs)


# ----------------------------------------------------------------------------------------------
# Knapsack-RL's allocator
# ----------------------------------------------------------------------------------------------
KNAPSACK_MIN_ROLLOUTS = 8  # rl_dataset.py `min_buffer_length`: fewer recorded rollouts -> not valid
KNAPSACK_CONFIDENCE = 0.9  # exploration_utils.py `alpha`: cost cap ln(1 - 0.9) / ln max(p, 1-p)


def knapsack_cost_cap(p, max_budget) -> np.ndarray:
    """Knapsack-RL's cost of a prompt with 0 < p < 1 (`sampling_budget_by_knapsack`, cost_estimation
    "probability"): int(min(B_up, ln 0.1 / ln max(p, 1-p))), the rollouts after which a group is
    all-equal with probability <= 0.1 (max(p,1-p)^N <= 0.1). p = 0.5: ln 0.1 / ln 0.5 = 3.32 -> 3."""
    p = np.asarray(p, dtype=float)
    cost = np.log(1.0 - KNAPSACK_CONFIDENCE) / np.log(np.maximum(p, 1.0 - p))
    return np.floor(np.minimum(float(max_budget), cost)).astype(int)  # int() of a positive float: floor


def allocate_knapsack(p_hat, valid, total_budget, min_budget, max_budget, default_budget=None) -> list[int]:
    """Knapsack-RL's published allocation (Li et al. 2025, arXiv 2509.25849; liziniu/KnapsackRL
    `verl/trainer/ppo/exploration_utils.py` `sampling_budget_by_knapsack` and `solve_by_dp`):

    1. an invalid prompt (fewer than 8 recorded rollouts, `valid` False) gets the default G
       (`default_budget`, B_total // M if None) and stays out of everything below;
    2. a valid prompt gets B_low (the launch script's min_n = negative_n = positive_n = 2);
    3. the valid 0 < p < 1 prompts ("informative") may use at most est = sum_i int(min(B_up,
       ln 0.1 / ln max(p_i, 1 - p_i))) surplus units; the rest (the fallback) goes evenly to the
       p = 0 prompts, or with none, to every non-informative prompt;
    4. an exact knapsack over the informative prompts places est units (R if there is no fallback),
       maximising sum_i Value(B_i, p_i) over the prompts given >= 1 unit above B_low: a prompt left
       at B_low counts 0, not Value(B_low) (`solve_by_dp`'s "don't allocate" option).
    With no informative prompt, the surplus goes evenly to the p = 0 prompts, else uniform.

    Ours where the official code breaks (docs/method-sources.md §4): nothing goes above B_up (the official fallback
    has no cap); what cannot be placed goes back to the knapsack, then to the other prompts; with
    every prompt informative the knapsack takes all R (the official divides by zero); the knapsack
    never gets more than its prompts hold (the official spreads its excess above max_n); the no-
    informative case is uniform_budgets (the official sets every prompt to G, dropping B_total % M).
    """
    p, valid = check_pass_rates(p_hat), np.asarray(valid, dtype=bool).ravel()
    M = p.size
    check_feasible(M, total_budget, min_budget, max_budget)
    lo, hi = int(min_budget), int(max_budget)
    G = int(total_budget) // M if default_budget is None else as_int(default_budget, "default budget")
    if not lo <= G <= hi:
        raise ValueError(f"default budget {G} must lie in [{lo}, {hi}]")
    budgets = np.where(valid, lo, G)  # (M,)
    informative = valid & (p > 0) & (p < 1)
    # the official code reads p = 0 from an array that invalid prompts leave at 0, so they count
    # as unsolved too: the fallback also feeds prompts it knows too little about
    zero = ~valid | (p == 0)
    R = int(total_budget) - int(budgets.sum())  # >= 0: every prompt has at most G <= B_total / M
    if not informative.any():
        if not zero.any():
            return uniform_budgets(M, total_budget)
        R = fill_evenly(budgets, np.flatnonzero(zero), R, hi)
        fill_evenly(budgets, np.flatnonzero(~zero), R, hi)  # ours: only when p = 0 prompts are full
        return budgets.tolist()
    inf_idx = np.flatnonzero(informative)
    capacity = inf_idx.size * (hi - lo)  # what the knapsack's prompts can hold
    fallback = zero if zero.any() else ~informative  # where the budget the knapsack can't use well goes
    est = int(knapsack_cost_cap(p[inf_idx], hi).sum())
    to_knapsack = min(est if (est < R and fallback.any()) else R, capacity)
    left = fill_evenly(budgets, np.flatnonzero(fallback), R - to_knapsack, hi)
    more = min(left, capacity - to_knapsack)  # ours: fallback prompts full -> back to the knapsack
    to_knapsack, left = to_knapsack + more, left - more
    fill_evenly(budgets, np.flatnonzero(~informative & ~fallback), left, hi)  # ours: last resort
    budgets[inf_idx] = _knapsack_units(p[inf_idx], to_knapsack, lo, hi)
    return budgets.tolist()


def _knapsack_units(p, units, min_budget, max_budget) -> list[int]:
    """Step 4 of allocate_knapsack: place exactly `units` above B_low over prompts with 0 < p < 1,
    maximising sum_i f_i(j_i), f_i(0) = 0, f_i(j) = Value(B_low + j, p_i) for j >= 1.

    f is concave when B_low >= 1 (its first gain Value(B_low + 1) is a sum of B_low + 1 gains of
    Value, each at least Value's later ones), so the heap is exact there and fast; at B_low = 0 it is
    not (f(1) = Value(1) = 0), so the exact DP decides. Ties may break differently from the official
    `solve_by_dp`; the objective is the same (tests).
    """
    lo, M = int(min_budget), p.size

    def f(B):  # (M,) budgets -> (M,) values; B = B_low counts 0
        return np.where(np.asarray(B) > lo, knapsack_value(B, p), 0.0)

    solver = allocate_lazy if lo >= 1 else allocate_dp
    return solver(f, M, M * lo + int(units), lo, max_budget)
