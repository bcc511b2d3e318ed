"""Which allocator an arm uses: the `--allocator` choices and the one call train.py makes each step.

    uniform         GRPO: B_total / M each (allocate.uniform_budgets)
    coba            the paper: eq. 9's value, Algorithm 1 (allocate.allocate, run as its fast exact
                    form speedups/lazy_heap.py), or our threshold solver (speedups/threshold.py)
    knapsack        Knapsack-RL's published allocator (arms/knapsack.py)
    coba-released   the released code's hybrid (arms/released.py)

Every allocator is uniform until a prompt has been seen (docs/method-sources.md §3).
Tests: tests/test_allocators.py; each arm's wiring in train.py: tests/test_step.py, tests/test_arms.py.
"""
from __future__ import annotations

import numpy as np

import coba
from allocate import check_feasible, check_pass_rates, uniform_budgets
from arms import knapsack, released
from speedups.lazy_heap import allocate_lazy
from speedups.threshold import allocate_threshold

ALLOCATORS = ("uniform", "knapsack", "coba", "coba-released")  # choices of train.py's --allocator
SOLVERS = ("heap", "threshold")  # how `coba` solves eq. 3: Algorithm 1, or our threshold solver


def allocate_budgets(allocator: str, pass_rates, seen, total_budget, min_budget, max_budget,
                     alpha_t, beta_t, tau, solver: str = "heap", knapsack_stats=None) -> list[int]:
    """B_i for this step's M prompts (docs/method-sources.md §2-4).

    allocator: uniform (GRPO), knapsack (Knapsack-RL's published method, allocate_knapsack), coba
      (eq. 9, Algorithm 1 with solver="heap", or our threshold solver with solver="threshold"; same
      optimum), coba-released (the released code's hybrid). solver only matters for coba.
    pass_rates: p_i (M,), the prior for unseen prompts; seen: (M,) bool, p_i comes from a past visit.
    tau: a number > 0, or "adaptive" (coba: over all M prompts; coba-released: over its heap's
      prompts, as the released code does; a number computed over all M is used as is).
    knapsack_stats: (p_hat (M,), rollouts (M,)) from coba.CapabilityTracker's knapsack.stats: Knapsack-
      RL's p estimate (last visit if >= 16 rollouts, else the last 16 rewards) and each prompt's
      recorded rollouts (valid from 8). None: p_hat = pass_rates, valid = seen (an approximation).
    If no prompt has been seen (the first epoch), every allocator returns uniform (docs/method-sources.md §3).
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"unknown allocator {allocator!r}: use one of {', '.join(ALLOCATORS)}")
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}: use one of {', '.join(SOLVERS)}")
    p = check_pass_rates(pass_rates)
    seen = np.asarray(seen, dtype=bool).ravel()
    if seen.shape != p.shape:
        raise ValueError(f"seen has {seen.size} entries for {p.size} pass rates: pass one flag per prompt")
    M = p.size
    check_feasible(M, total_budget, min_budget, max_budget)
    if allocator == "uniform" or not seen.any():
        return uniform_budgets(M, total_budget)
    return ALLOCATE[allocator](p, seen, total_budget, int(min_budget), int(max_budget), alpha_t, beta_t, tau,
                              solver, knapsack_stats)


# The rule of each --allocator once some prompt has been seen: (p, seen, B_total, B_low, B_up,
# alpha_t, beta_t, tau, solver, knapsack_stats) -> B_i
def _coba(p, seen, total_budget, lo, hi, alpha_t, beta_t, tau, solver, knapsack_stats) -> list[int]:
    """The paper: eq. 9's value, Algorithm 1 in its fast exact form, or our threshold solver."""
    tau = coba.resolve_tau(tau, p)  # "adaptive" -> over all M prompts (a number passes through)
    if solver == "threshold":
        C, k = coba.capability_value_coeffs(p, alpha_t, beta_t, tau)
        return allocate_threshold(C, k, total_budget, lo, hi)
    value = lambda B: coba.capability_value(B, p, alpha_t, beta_t, tau)  # noqa: E731  eq. 9
    return allocate_lazy(value, p.size, total_budget, lo, hi)  # Algorithm 1, in its fast exact form


def _knapsack(p, seen, total_budget, lo, hi, alpha_t, beta_t, tau, solver, knapsack_stats) -> list[int]:
    """Knapsack-RL's published allocator, on its own p estimate (valid from 8 recorded rollouts)."""
    if knapsack_stats is None:
        return knapsack.allocate_knapsack(p, seen, total_budget, lo, hi)
    p_hat, rollouts = (np.asarray(x, dtype=float).ravel() for x in knapsack_stats)
    if not p_hat.shape == rollouts.shape == p.shape:
        raise ValueError(f"knapsack_stats must be two arrays of {p.size} entries (p_hat, rollouts), "
                         f"got {p_hat.size} and {rollouts.size}")
    return knapsack.allocate_knapsack(p_hat, rollouts >= knapsack.KNAPSACK_MIN_ROLLOUTS, total_budget, lo, hi)


def _released(p, seen, total_budget, lo, hi, alpha_t, beta_t, tau, solver, knapsack_stats) -> list[int]:
    """The released code's hybrid (tau "adaptive": over its heap's prompts only)."""
    return released.allocate_released(p, total_budget, lo, hi, alpha_t, beta_t, tau)


ALLOCATE = {"coba": _coba, "knapsack": _knapsack, "coba-released": _released}
