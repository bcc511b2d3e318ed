"""Budget allocation of CoBA-RL (arXiv 2602.03048, eq. 3 and §2.4): how many rollouts B_i each prompt gets.

Eq. 3: maximise sum_i V_i(B_i) subject to sum_i B_i = B_total, B_low <= B_i <= B_up, B_i integer.
V_i is eq. 9's value (coba.capability_value) or any other per-prompt value. Top to bottom:

    check_feasible   B_low M <= B_total <= B_up M, or a one-line error in those terms
    check_values, check_pass_rates   V >= 0 and finite; p_i in [0, 1]
    uniform_budgets  GRPO's baseline: B_total / M each, the remainder one each
    total_value      the objective of eq. 3, sum_i V_i(B_i)
    budget_grid, value_columns   the surplus R = B_total - M B_low and V_i on the budgets reachable
    allocate         Algorithm 1 (§2.4): a max-heap of marginal gains, O(B_total log M); exactly
                     optimal when every V_i is concave in B (App. A, Prop. 2.2 proves it for eq. 9)
    allocate_dp      the exact dynamic programme, the reference of §3.6 / Table 4 (any values)

Non-concave values: the greedy still returns a feasible allocation but is only a heuristic (a large
gain behind a small one is never reached); the DP is exact for any values. Optimal allocations need
not be unique (ties): compare objectives (total_value), not vectors.

Beneath: training calls the same greedy in its fast exact form, speedups/lazy_heap.py (values only
as deep as the deepest prompt goes; same pops, same result), through arms/allocators.py, the table of
`--allocator` choices; our threshold solver for eq. 9's form is speedups/threshold.py; Knapsack-RL's
allocator is arms/knapsack.py and the released code's hybrid arms/released.py. Benchmark (Table 4):
`python bench.py allocate`. Which part is whose: docs/method-sources.md §2, "Allocation: which
part is whose".
Tests: tests/test_allocate.py (the paper's solvers and the speed-ups), tests/test_allocators.py.
"""
from __future__ import annotations

import heapq
import operator
from typing import Callable, Union

import numpy as np

# value_fn: budgets (M,) int -> values (M,), or a table (M, >= B_up + 1) with table[i, B] = V_i(B)
Values = Union[Callable[[np.ndarray], np.ndarray], np.ndarray]


# ----------------------------------------------------------------------------------------------
# Eq. 3's constraints and objective
# ----------------------------------------------------------------------------------------------
def as_int(x, name: str) -> int:
    """x as a Python int; numpy ints pass, 2.5 and "8" do not (budgets are rollout counts)."""
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {x!r}") from None


def check_feasible(num_prompts, total_budget, min_budget, max_budget) -> None:
    """Raise ValueError unless M >= 1, 0 <= B_low <= B_up and B_low M <= B_total <= B_up M (eq. 3)."""
    M, total = as_int(num_prompts, "M"), as_int(total_budget, "B_total")
    lo, hi = as_int(min_budget, "B_low"), as_int(max_budget, "B_up")
    if M < 1:
        raise ValueError(f"M = {M} < 1: need at least one prompt")
    if lo < 0:
        raise ValueError(f"B_low = {lo} < 0: a budget counts rollouts")
    if lo > hi:
        raise ValueError(f"B_low = {lo} > B_up = {hi}: no budget lies in [B_low, B_up]")
    if total < M * lo:
        raise ValueError(f"B_total = {total} < M x B_low = {M} x {lo} = {M * lo}: eq. 3 is infeasible")
    if total > M * hi:
        raise ValueError(f"B_total = {total} > M x B_up = {M} x {hi} = {M * hi}: eq. 3 is infeasible")


def check_values(values: np.ndarray, what: str) -> None:
    """Raise ValueError on NaN, inf or negative values (V is a non-negative value, eq. 9)."""
    if np.isfinite(values).all() and (values >= 0).all():  # the common case, in two passes
        return
    if np.isnan(values).any():
        raise ValueError(f"{what} contains NaN: check the pass rates and alpha_t, beta_t, tau")
    if not np.isfinite(values).all():
        raise ValueError(f"{what} contains inf: values must be finite")
    if (values < 0).any():
        raise ValueError(f"{what} has negative entries (min {values.min():.3g}): values must be >= 0")


def check_pass_rates(pass_rates) -> np.ndarray:
    """p_i as a float array (M,); raise ValueError unless every p_i is in [0, 1] (eq. 9's input)."""
    p = np.asarray(pass_rates, dtype=float).ravel()  # (M,)
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"pass rates must be in [0, 1] without NaN, got min {np.nanmin(p) if p.size else None}, "
                         f"max {np.nanmax(p) if p.size else None}")
    return p


def uniform_budgets(num_prompts, total_budget) -> list[int]:
    """GRPO: B_total / M each; the remainder goes one each to the first prompts (10 over 4: 3,3,2,2)."""
    M, total = as_int(num_prompts, "M"), as_int(total_budget, "B_total")
    if M < 1 or total < 0:
        raise ValueError(f"need M >= 1 prompts and B_total >= 0, got M = {M}, B_total = {total}")
    q, r = divmod(total, M)
    return [q + 1] * r + [q] * (M - r)


def total_value(value_fn: Values, budgets) -> float:
    """The objective of eq. 3, sum_i V_i(B_i), for a value function or a value table."""
    B = np.asarray(budgets, dtype=int)  # (M,)
    if callable(value_fn):
        return float(np.sum(value_fn(B)))
    return float(np.asarray(value_fn, dtype=float)[np.arange(len(B)), B].sum())


def budget_grid(num_prompts, total_budget, min_budget, max_budget, step=1) -> tuple[int, int, int]:
    """Check eq. 3's inputs; return M, R and D. Budgets move in units of `step` above B_low (1 in the
    paper): R = (B_total - M B_low) / step units to hand out, and D = min(L, R), L = (B_up - B_low) /
    step, the deepest level any prompt can reach (no prompt takes more than the R units there are)."""
    check_feasible(num_prompts, total_budget, min_budget, max_budget)
    M, lo, hi, step = int(num_prompts), int(min_budget), int(max_budget), as_int(step, "step")
    surplus = int(total_budget) - M * lo
    if step < 1 or surplus % step or (hi - lo) % step:
        raise ValueError(f"step {step} must be >= 1 and divide both B_total - M B_low = {surplus} and "
                         f"B_up - B_low = {hi - lo}")
    R = surplus // step
    return M, R, min((hi - lo) // step, R)


def value_columns(value_fn: Values, num_prompts, min_budget, max_budget, step, j0, j1) -> np.ndarray:
    """(M, j1 - j0) with [i, j - j0] = V_i(B_low + step j), checked finite and >= 0. A callable is
    called once per budget level, vectorised over the M prompts; a table must reach B_up."""
    M, lo, hi = int(num_prompts), int(min_budget), int(max_budget)
    if callable(value_fn):
        cols = [np.asarray(value_fn(np.full(M, lo + step * j)), dtype=float).reshape(M) for j in range(j0, j1)]
        V = np.stack(cols, axis=1) if cols else np.empty((M, 0))
    else:
        table = np.asarray(value_fn, dtype=float)
        if table.ndim != 2 or table.shape[0] != M or table.shape[1] <= hi:
            raise ValueError(f"value table must have shape ({M}, >= {hi + 1}) = (M, B_up + 1), got {table.shape}")
        V = table[:, lo + step * np.arange(j0, j1)]
    check_values(V, "value table")
    return V


# ----------------------------------------------------------------------------------------------
# Paper §2.4, Algorithm 1: heap-based greedy over marginal gains
# ----------------------------------------------------------------------------------------------
def allocate(value_fn: Values, num_prompts, total_budget, min_budget, max_budget, step=1) -> list[int]:
    """Algorithm 1: every prompt starts at B_low; the surplus goes one unit at a time to the prompt
    whose next unit gains the most, V_i(B_i + 1) - V_i(B_i), kept in a max-heap.

    Exactly optimal when each V_i is concave in B (paper §2.4; App. A, Prop. 2.2: eq. 9's gain
    C e^{-kB}(1 - e^{-k}) falls geometrically); otherwise a heuristic that stays feasible.
    value_fn: budgets (M,) -> values (M,), vectorised, or a table (M, >= B_up + 1) of V_i(B).
    step: budgets move in multiples of `step` above B_low (1 in the paper).
    Fast exact version (what training calls): speedups/lazy_heap.py's allocate_lazy.
    """
    M, R, D = budget_grid(num_prompts, total_budget, min_budget, max_budget, step)
    V = value_columns(value_fn, M, min_budget, max_budget, step, 0, D + 1)  # (M, D+1): V_i(B_low + step j)
    gain = np.diff(V, axis=1)  # (M, D): gain[i, j] = V_i(level j + 1) - V_i(level j)
    B = [0] * M  # B_i <- B_low (counted in units of step above it)
    heap = [(-g[0], i) for i, g in enumerate(gain) if g.size]  # heapq is a min-heap: push -gain;
    heapq.heapify(heap)  # equal gains pop the smaller i first
    for _ in range(R):  # R <- B_total - M B_low; while R > 0 (feasibility: the heap never runs dry)
        _, i = heapq.heappop(heap)  # the largest marginal gain
        B[i] += 1  # B_i <- B_i + 1; R <- R - 1
        if B[i] < D:  # below B_up (and below R): push prompt i's next gain
            heapq.heappush(heap, (-gain[i, B[i]], i))
    return [int(min_budget) + int(step) * b for b in B]


# ----------------------------------------------------------------------------------------------
# Paper §3.6: the exact dynamic programme (the reference of Table 4)
# ----------------------------------------------------------------------------------------------
def allocate_dp(value_fn: Values, num_prompts, total_budget, min_budget, max_budget, step=1) -> list[int]:
    """Exact optimum of eq. 3 for any values (concave or not), by dynamic programming over prompts.

    best[r] = the highest total value of the prompts so far using r surplus units. Adding prompt i
    is a max-plus convolution with its row T[i]: best'[r] = max_j best[r - j] + T[i, j]. Each step
    is vectorised over r and j with numpy (a sliding window over best), so this is a fair
    reference, not a Python triple loop: O(M * R * L) arithmetic, O(M * R) memory for the choices.
    """
    M, R, L = budget_grid(num_prompts, total_budget, min_budget, max_budget, step)  # L: deepest level
    T = value_columns(value_fn, M, min_budget, max_budget, step, 0, L + 1)  # (M, L+1)
    best = np.full(R + 1, -np.inf)  # (R+1,)
    best[0] = 0.0
    padded = np.full(L + R + 1, -np.inf)  # L slots of -inf before best: r - j < 0 is impossible
    window = np.lib.stride_tricks.sliding_window_view(padded, L + 1)  # (R+1, L+1): padded[r : r+L+1]
    chunk = max(1, min(R + 1, 2 ** 18 // (L + 1)))  # rows per block: a 2 MB buffer stays in cache
    cand = np.empty((chunk, L + 1))  # (chunk, L+1) reused buffer
    rows = np.arange(chunk)
    choice = np.empty((M, R + 1), dtype=np.uint8 if L < 256 else np.int32)  # units given to prompt i
    T_rev = np.ascontiguousarray(T[:, ::-1])  # (M, L+1): T_rev[i, s] = V_i at j = L - s units
    for i in range(M):
        padded[L:] = best
        for r0 in range(0, R + 1, chunk):  # blocks of r: same arithmetic, fewer trips to memory
            r1 = min(r0 + chunk, R + 1)
            c = cand[: r1 - r0]
            # window[r, s] = best[r - (L - s)]: prompt i takes j = L - s units, hence T reversed
            np.add(window[r0:r1], T_rev[i], out=c)
            s = c.argmax(axis=1)  # (r1-r0,)
            best[r0:r1] = c[rows[: r1 - r0], s]
            choice[i, r0:r1] = L - s
    extra, r = [0] * M, R
    for i in reversed(range(M)):  # walk the choices back from r = R
        extra[i] = int(choice[i, r])
        r -= extra[i]
    return [int(min_budget) + int(step) * e for e in extra]
