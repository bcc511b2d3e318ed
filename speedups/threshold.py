"""Our exact threshold solver of eq. 3 for eq. 9's form V_i(B) = C_i (1 - e^{-k_i B}).

Accelerates allocate.allocate (Algorithm 1) when the values have eq. 9's closed form (App. A:
coba.capability_value_coeffs gives C, k): the greedy optimum is "every marginal gain above a
threshold lambda", and each prompt's count at a given lambda is closed form, so bisect lambda
instead of handing units out one at a time. O(M log(1/eps)) instead of O(B_total log M), and
independent of the budget's size; the same objective as the heap (ties may break differently).
Equivalence test: tests/test_allocate.py (test_threshold_*). Used by arms/allocators.py
(`--allocator coba` with solver="threshold").

Also the even passes (spread_evenly, fill_evenly) that place units on prompts whose gain is
zero; the published allocators (arms/knapsack.py, arms/released.py) use them too.
"""
from __future__ import annotations

import numpy as np

from allocate import check_feasible, check_values


def allocate_threshold(C, k, total_budget, min_budget, max_budget) -> list[int]:
    """The same optimum as Algorithm 1 for V_i(B) = C_i (1 - e^{-k_i B}) (eq. 9 via
    coba.capability_value_coeffs), without handing units out one by one.

    Why it works: the gain of prompt i's unit from B to B+1 is a_i e^{-k_i B} with
    a_i = C_i (1 - e^{-k_i}) (Prop. 2.2), decreasing in B. The greedy takes the R largest gains
    overall, i.e. every gain above some threshold lambda = e^mu. At a given mu the number of prompt
    i's units (above B_low) whose gain beats lambda is closed form: the j in [0, L) with
    u_i - k_i j > mu, where u_i = log a_i - k_i B_low, i.e. clip(ceil((u_i - mu) / k_i), 0, L).
    Bisect mu until at most ~2M gains lie between the bracket's ends, then list those gains and
    take the largest ones that are still missing: exact, including ties, whatever the budget size.
    C, k: (M,), C >= 0, k >= 0 finite. Prompts with C = 0 or k = 0 have zero gain everywhere.
    """
    C, k = np.asarray(C, dtype=float).ravel(), np.asarray(k, dtype=float).ravel()  # (M,)
    if C.shape != k.shape:
        raise ValueError(f"C and k must have the same length, got {C.size} and {k.size}")
    check_values(C, "C")
    check_values(k, "k")
    M = C.size
    check_feasible(M, total_budget, min_budget, max_budget)
    lo, hi = int(min_budget), int(max_budget)
    L, R = hi - lo, int(total_budget) - M * lo
    budgets = np.full(M, lo)
    a = C * -np.expm1(-k)  # (M,) gain of the first unit above B = 0; 0 when C = 0 or k = 0
    live = a > 0  # prompts with positive gains; the others are indifferent to their budget
    if R > L * live.sum():  # every live prompt at B_up; the rest goes to zero-gain prompts
        budgets[live] = hi
        fill_evenly(budgets, np.flatnonzero(~live), int(total_budget) - int(budgets.sum()), hi)
        return budgets.tolist()
    if R == 0:
        return budgets.tolist()
    u, kl = np.log(a[live]) - k[live] * lo, k[live]  # (Ml,) log-gain of each live prompt's first unit

    def count(mu):  # (Ml,) units whose gain beats e^mu; monotone in mu even in floating point
        return np.clip(np.ceil((u - mu) / kl), 0, L)

    mu_hi, mu_lo = u.max(), (u - kl * L).min() - 1.0  # count(mu_hi) = 0 <= R <= count(mu_lo) = everything
    n_hi, n_lo = count(mu_hi), count(mu_lo)
    while n_lo.sum() - n_hi.sum() > 2 * u.size:
        mu = 0.5 * (mu_lo + mu_hi)
        if mu in (mu_lo, mu_hi):  # adjacent floats: the gains left between them are equal to the last bit
            break
        n = count(mu)
        if n.sum() >= R:
            mu_lo, n_lo = mu, n
        else:
            mu_hi, n_hi = mu, n
    # every gain above e^mu_hi is taken; the missing units are the largest gains in (e^mu_lo, e^mu_hi]
    n_hi, d = n_hi.astype(int), (n_lo - n_hi).astype(int)  # (Ml,) candidates per prompt
    missing = R - int(n_hi.sum())
    if d.sum() > 2 * u.size:  # float ties only (e.g. k ~ 1e-25): fill in prompt order, any choice is optimal
        budgets[live] += n_hi + np.clip(missing - (np.cumsum(d) - d), 0, d)
        return budgets.tolist()
    owner = np.repeat(np.arange(u.size), d)  # (D,) prompt of each candidate gain, D <= 2 Ml
    j = n_hi[owner] + np.arange(owner.size) - np.repeat(np.cumsum(d) - d, d)  # (D,) its unit index
    log_gain = u[owner] - kl[owner] * j  # (D,)
    if missing < owner.size:  # the `missing` largest; per prompt a prefix, since gains fall in j
        owner = owner[np.argpartition(-log_gain, missing - 1)[:missing]] if missing else owner[:0]
    budgets[live] += n_hi + np.bincount(owner, minlength=u.size)
    return budgets.tolist()


def spread_evenly(budgets: np.ndarray, idx, left: int, max_budget: int) -> int:
    """Hand `left` units evenly to prompts `idx` (in order) that are below B_up, in place: left // n
    each, one more to the first left % n, none above B_up. Returns what did not fit. The even pass of
    both published allocators (Knapsack-RL `sampling_budget_by_knapsack`'s fallback, CoBA-RL
    `BetaAllocator._allocate_remaining_uniform`), except that Knapsack-RL has no B_up cap here."""
    room_idx = [i for i in idx if budgets[i] < max_budget]
    if left <= 0 or not room_idx:
        return left
    per, first = divmod(left, len(room_idx))
    for k, i in enumerate(room_idx):
        give = min(per + (k < first), max_budget - int(budgets[i]))
        budgets[i] += give
        left -= give
    return left


def fill_evenly(budgets: np.ndarray, idx, left: int, max_budget: int) -> int:
    """spread_evenly again and again while it places something: when B_up stops some prompts,
    the others take their part (one pass, the published result, when no cap binds)."""
    while True:
        now = spread_evenly(budgets, idx, left, max_budget)
        if now in (0, left):
            return now
        left = now
