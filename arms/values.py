"""The three values behind one interface V(budget, p), by `--allocator`: uniform GRPO, Knapsack-RL
(arms/knapsack.py) and CoBA-RL's eq. 9 (coba.capability_value), so that allocators can swap them.

Uniform GRPO written as a value is ours (docs/method-sources.md §1); allocate.uniform_budgets is
its shortcut.

Tests: tests/test_coba.py (test_value_function_interface).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

import coba
from arms.knapsack import knapsack_value


def uniform_value(budget, p):
    """Uniform GRPO as a value: 1 - 2^-B, the same concave curve for every prompt, so a greedy
    allocator fills all prompts level by level: B_total / M each (remainder one each)."""
    B = np.asarray(budget, dtype=float)
    V = (1.0 - np.exp2(-B)) + 0.0 * np.asarray(p, dtype=float)  # broadcast to p's shape
    return float(V) if V.ndim == 0 else V


VALUE_FUNCTIONS = ("uniform", "knapsack", "coba")


def value_function(allocator: str, alpha_t: float | None = None, beta_t: float | None = None,
                   tau: float | None = None) -> Callable:
    """`--allocator` -> V(budget, p): one signature for the three values, so allocators can swap.
    coba needs alpha_t, beta_t, tau (this step's); the other two ignore them."""
    if allocator == "uniform":
        return uniform_value
    if allocator == "knapsack":
        return knapsack_value
    if allocator == "coba":
        if alpha_t is None or beta_t is None or tau is None:
            raise ValueError("value_function('coba') needs alpha_t, beta_t and tau")
        return lambda budget, p: coba.capability_value(budget, p, alpha_t, beta_t, tau)
    raise ValueError(f"allocator {allocator!r} has no value function; use one of {', '.join(VALUE_FUNCTIONS)}")
