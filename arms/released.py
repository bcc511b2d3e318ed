"""The released CoBA-RL code's hybrid allocator, the `--allocator coba-released` arm (docs/arms.md).

Within-yao/CoBA-RL@aa6b834 `recipe/coba_rl/budget_allocators.py`, `BetaAllocator.allocate`,
vector for vector where it places the whole budget: not the paper's Algorithm 1 over all prompts
but Algorithm 1 over the mid pass rates with a share of the surplus, the rest split in proportion
to 1 - p. What differs from the paper and what we fix: docs/method-sources.md §2.
Tests: tests/test_allocators.py.

    allocate_released         the allocation, steps 1-4 of its docstring
    _released_leftover_pass   one leftover pass over a group of prompts
"""
from __future__ import annotations

import numpy as np

import coba
from allocate import check_feasible, check_pass_rates
from speedups.lazy_heap import allocate_lazy
from speedups.threshold import spread_evenly

# These prompts stay out of the released code's heap.
VERY_HARD = 0.05  # p < 0.05
VERY_EASY = 0.99  # p > 0.99

RELEASED_SHARE = (0.6, 0.8)  # the heap's share of the surplus: min_ratio, exploration_budget_ratio
RELEASED_WEIGHT_CLIP = 1e-6  # `_allocate_remaining_weighted` clips p to [1e-6, 1 - 1e-6] in 1 - p


def _released_leftover_pass(budgets: np.ndarray, idx, p: np.ndarray, left: int, max_budget: int) -> int:
    """One leftover pass of the released allocator over prompts idx (`BetaAllocator.
    _allocate_remaining_weighted`), in place; returns what is left for the next group.

    Prompts below B_up, in order, each take int(left * w_i / W), w_i = 1 - clip(p_i, 1e-6, 1 - 1e-6),
    W their sum, where `left` shrinks as the loop goes (so later prompts get less than their exact
    share), capped at B_up; then one even pass (spread_evenly) over those still below B_up.
    """
    room_idx = [i for i in idx if budgets[i] < max_budget]
    if left <= 0 or not room_idx:
        return left
    w = [1.0 - float(np.clip(p[i], RELEASED_WEIGHT_CLIP, 1.0 - RELEASED_WEIGHT_CLIP)) for i in room_idx]
    W = sum(w)
    for i, w_i in zip(room_idx, w):
        give = min(int(left * w_i / W), max_budget - int(budgets[i]))
        budgets[i] += give
        left -= give
    return spread_evenly(budgets, room_idx, left, max_budget)


def allocate_released(pass_rates, total_budget, min_budget, max_budget, alpha_t, beta_t, tau) -> list[int]:
    """The released code's allocation (docs/method-sources.md §2; Within-yao/CoBA-RL@aa6b834
    `recipe/coba_rl/budget_allocators.py`, `BetaAllocator.allocate`), not Algorithm 1 over all prompts:

    1. every prompt gets B_low;
    2. prompts with p < 0.05 (very hard) or p > 0.99 (very easy) stay out of the heap;
    3. Algorithm 1 with eq. 9 runs over the others with a share of the surplus: 0.8 if they are more
       than half the batch, else 0.6 + (0.8 - 0.6) * 2 * (their fraction), so 0.6 with none; the
       heap stops when its prompts are all at B_up (`_allocate_beta_greedy_internal`). tau =
       "adaptive" is computed over the heap's prompts only (`_update_tau_global`); a number is used as is;
    4. what is left goes to the very hard prompts, then the heap's, then the very easy ones, one
       `_released_leftover_pass` each.
    Ours: where caps bind, the released code can end with units unplaced (sum < B_total); we repeat
    the passes until none is left (with caps not binding, one round, the released result).
    """
    p = check_pass_rates(pass_rates)
    M = p.size
    check_feasible(M, total_budget, min_budget, max_budget)
    lo, hi = int(min_budget), int(max_budget)
    budgets = np.full(M, lo)  # (M,)
    very_hard, very_easy = p < VERY_HARD, p > VERY_EASY
    in_heap = ~(very_hard | very_easy)
    n_heap, surplus = int(in_heap.sum()), int(total_budget) - M * lo
    share_min, share_max = RELEASED_SHARE
    # the released arithmetic, operation for operation: int() of the product decides boundary units
    share = share_max if n_heap > M / 2 else share_min + (share_max - share_min) * ((n_heap / M) * 2)
    heap_budget = min(int(surplus * share), n_heap * (hi - lo))  # the heap stops at B_up: the cap
    if heap_budget > 0:
        p_heap = p[in_heap]
        tau_heap = coba.adaptive_tau(p_heap) if tau == "adaptive" else coba.resolve_tau(tau, p_heap)
        value = lambda B: coba.capability_value(B, p_heap, alpha_t, beta_t, tau_heap)  # noqa: E731
        budgets[in_heap] = allocate_lazy(value, n_heap, n_heap * lo + heap_budget, lo, hi)
    left = int(total_budget) - int(budgets.sum())
    groups = [np.flatnonzero(g) for g in (very_hard, in_heap, very_easy)]
    while left > 0:  # one round unless caps bind; each round places >= 1 unit while any prompt has room
        for idx in groups:
            left = _released_leftover_pass(budgets, idx, p, left, hi)
    return budgets.tolist()
