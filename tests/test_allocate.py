"""Tests of allocate.py: Algorithm 1 (paper §2.4) against the exact DP and brute force, our threshold
solver against the heap, the released code's hybrid, the dispatcher and its errors.

Optimal allocations need not be unique (ties), so solvers are compared by objective
sum_i V_i(B_i), never by vector; exact vectors appear only where they document a behaviour.

Run: cd /work/main && python -m pytest -q tests/test_allocate.py   (a few seconds, no model needed)
"""
import math

import numpy as np
import pytest

import allocate as A


# ----------------------------------------------------------------------------------------------
# Helpers: random cases
# ----------------------------------------------------------------------------------------------
def concave_table(rng, M, hi, ties=False):
    """(M, hi+1) values with V(0) = 0 and non-increasing gains. ties=True draws gains from {0,..,3}:
    many exactly equal gains and exact sums (integers), the hardest case for tie handling."""
    if ties:
        gains = -np.sort(-rng.integers(0, 4, size=(M, hi)).astype(float), axis=1)
    else:
        gains = -np.sort(-rng.exponential(size=(M, hi)), axis=1)
    return np.concatenate([np.zeros((M, 1)), np.cumsum(gains, axis=1)], axis=1)


def random_case(rng):
    """(M, B_total, B_low, B_up) with edge cases mixed in: B_low = B_up, tight totals."""
    M = int(rng.integers(1, 12))
    lo = int(rng.integers(0, 4))
    hi = lo + int(rng.choice([0, 1, 3, 8, 15]))
    total = int(rng.choice([M * lo, M * hi, rng.integers(M * lo, M * hi + 1)]))
    return M, total, lo, hi


def assert_feasible(budgets, M, total, lo, hi):
    b = np.asarray(budgets)
    assert b.shape == (M,) and b.sum() == total and b.min() >= lo and b.max() <= hi, (budgets, total, lo, hi)
    assert all(isinstance(x, int) for x in budgets)  # plain ints: train.py uses them as group sizes


def exp_value(C, k):
    """V_i(B) = C_i (1 - e^{-k_i B}), the form of eq. 9 (App. A), as a vectorised value function."""
    return lambda B: C * -np.expm1(-k * np.asarray(B, dtype=float))


# ----------------------------------------------------------------------------------------------
# Algorithm 1 vs exact references
# ----------------------------------------------------------------------------------------------
def test_heap_equals_dp_on_250_random_concave_cases():
    # App. A, Prop. 2.2: concave V -> the greedy is exactly optimal; the DP knows nothing of concavity
    rng = np.random.default_rng(0)
    for case in range(250):
        M, total, lo, hi = random_case(rng)
        table = concave_table(rng, M, hi, ties=case % 3 == 0)
        b_heap, b_dp = A.allocate(table, M, total, lo, hi), A.allocate_dp(table, M, total, lo, hi)
        assert_feasible(b_heap, M, total, lo, hi)
        assert_feasible(b_dp, M, total, lo, hi)
        assert A.total_value(table, b_heap) == pytest.approx(A.total_value(table, b_dp), abs=1e-9), case


def test_heap_and_dp_equal_brute_force_on_tiny_cases():
    rng = np.random.default_rng(1)
    for case in range(60):
        M, lo = int(rng.integers(1, 5)), int(rng.integers(0, 3))
        hi = lo + int(rng.integers(0, 6))
        total = int(rng.integers(M * lo, M * hi + 1))
        table = concave_table(rng, M, hi, ties=case % 2 == 0)
        best = A.total_value(table, A.allocate_brute_force(table, M, total, lo, hi))
        assert A.total_value(table, A.allocate(table, M, total, lo, hi)) == pytest.approx(best, abs=1e-9)
        assert A.total_value(table, A.allocate_dp(table, M, total, lo, hi)) == pytest.approx(best, abs=1e-9)


def test_heap_small_example_by_hand():
    # gains: prompt 0: 5, 1, 1; prompt 1: 3, 2, 0. B_low = 0, 3 units: take 5 (p0), 3 (p1), 2 (p1)
    table = np.array([[0, 5, 6, 7], [0, 3, 5, 5]], dtype=float)
    assert A.allocate(table, 2, 3, 0, 3) == [1, 2]  # value 5 + 5 = 10
    assert A.total_value(table, A.allocate_dp(table, 2, 3, 0, 3)) == 10.0


def test_heap_work_does_not_grow_with_max_budget():
    # issue 16, item 11: the heap used to build the whole (M, B_up + 1) table first (8.8 s, 1.45 GB at
    # M = 256, B_up = 100,000). Now it evaluates budget levels only as deep as the deepest prompt goes
    # (doubling): here 4 prompts, 64 rollouts, B_up = 10^6 -> a few dozen levels, not 10^6.
    C, k = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.05, 0.1, 0.2, 0.4])
    calls = []

    def value(B):
        calls.append(int(B[0]))  # one call per budget level (vectorised over prompts)
        assert len(calls) <= 200, "the heap evaluated far more budget levels than any prompt can use"
        return C * -np.expm1(-k * B)

    b = A.allocate(value, 4, 64, 2, 10 ** 6)
    assert len(calls) <= 2 * (max(b) - 2) + 9  # levels 0..depth, depth < 2 x the deepest prompt (or 8)
    ref = A.allocate(exp_value(C, k), 4, 64, 2, 100)  # same pops as with a narrow B_up
    assert b == ref and sum(b) == 64


def test_value_function_and_table_give_the_same_allocation():
    C, k = np.array([1.0, 2.0, 0.5]), np.array([0.3, 0.1, 0.9])
    fn = exp_value(C, k)
    table = C[:, None] * -np.expm1(-k[:, None] * np.arange(11))  # (3, 11): table[i, B] = V_i(B)
    assert A.allocate(fn, 3, 15, 2, 10) == A.allocate(table, 3, 15, 2, 10)
    assert A.allocate_dp(fn, 3, 15, 2, 10) == A.allocate_dp(table, 3, 15, 2, 10)


def test_step_moves_budgets_in_multiples_of_step():
    rng = np.random.default_rng(2)
    for _ in range(20):
        M = int(rng.integers(1, 6))
        table = concave_table(rng, M, 18)
        total = 2 * M + 2 * int(rng.integers(0, 8 * M + 1))  # surplus even, B_up - B_low = 16 even
        b = A.allocate(table, M, total, 2, 18, step=2)
        assert_feasible(b, M, total, 2, 18)
        assert all((x - 2) % 2 == 0 for x in b)
        assert A.total_value(table, b) == pytest.approx(
            A.total_value(table, A.allocate_dp(table, M, total, 2, 18, step=2)), abs=1e-9)
    with pytest.raises(ValueError, match="step 2 must"):
        A.allocate(concave_table(rng, 2, 18), 2, 9, 2, 18, step=2)  # surplus 5 is odd


def test_non_concave_values_greedy_is_only_a_heuristic():
    # Prompt 0 pays only at B = 3 (gains 0, 0, 10: convex); prompt 1 pays 1 per unit. 3 units.
    # Greedy sees gain 0 for prompt 0 and 1 for prompt 1 at every pop -> (0, 3), value 3.
    # The DP finds (3, 0), value 10. Greedy still hands out every unit within the bounds.
    table = np.array([[0, 0, 0, 10], [0, 1, 2, 3]], dtype=float)
    assert A.allocate(table, 2, 3, 0, 3) == [0, 3]
    assert A.allocate_dp(table, 2, 3, 0, 3) == [3, 0]
    assert A.allocate_brute_force(table, 2, 3, 0, 3) == [3, 0]
    # random non-concave values: feasible always, never above the DP, and below it somewhere
    rng = np.random.default_rng(3)
    gaps = []
    for _ in range(60):
        M, total, lo, hi = random_case(rng)
        table = rng.uniform(0, 1, size=(M, hi + 1))  # arbitrary, non-monotone
        b = A.allocate(table, M, total, lo, hi)
        assert_feasible(b, M, total, lo, hi)
        opt = A.total_value(table, A.allocate_dp(table, M, total, lo, hi))
        assert A.total_value(table, b) <= opt + 1e-9
        gaps.append(opt - A.total_value(table, b))
    assert max(gaps) > 0.1


# ----------------------------------------------------------------------------------------------
# Ours: threshold solver vs the heap
# ----------------------------------------------------------------------------------------------
def random_coeffs(rng, M, kind):
    C, k = rng.gamma(2.0, size=M), rng.uniform(0.002, 0.09, size=M)  # k = p(1-p)/tau in eq. 9
    if kind == "ties":  # whole prompts repeated: exactly equal gains across prompts
        idx = rng.integers(0, max(1, M // 3), size=M)
        C, k = C[idx], k[idx]
    elif kind == "zeros":  # C = 0 (zero density) and k = 0 prompts: zero gain at every budget
        C[rng.random(M) < 0.3] = 0.0
        k[rng.random(M) < 0.3] = 0.0
    elif kind == "steep":  # fast saturation: gains underflow to exactly 0 in the heap's differences
        k = rng.uniform(0.5, 40.0, size=M)
    return C, k


@pytest.mark.parametrize("kind", ["plain", "ties", "zeros", "steep"])
def test_threshold_equals_heap_on_random_cases(kind):
    rng = np.random.default_rng({"plain": 4, "ties": 5, "zeros": 6, "steep": 7}[kind])
    for _ in range(60):
        M, total, lo, hi = random_case(rng)
        C, k = random_coeffs(rng, M, kind)
        fn = exp_value(C, k)
        b_thr, b_heap = A.allocate_threshold(C, k, total, lo, hi), A.allocate(fn, M, total, lo, hi)
        assert_feasible(b_thr, M, total, lo, hi)
        v_thr, v_heap = A.total_value(fn, b_thr), A.total_value(fn, b_heap)
        assert v_thr == pytest.approx(v_heap, rel=1e-9, abs=1e-300)


def test_threshold_equals_heap_at_paper_scale_and_large_budgets():
    rng = np.random.default_rng(8)
    for M, total, lo, hi in [(512, 8192, 2, 128), (5, 60_000, 2, 20_000), (40, 80 * 1000, 2, 4000)]:
        C, k = rng.gamma(2.0, size=M), rng.uniform(1e-4, 0.09, size=M)
        fn = exp_value(C, k)
        b_thr, b_heap = A.allocate_threshold(C, k, total, lo, hi), A.allocate(fn, M, total, lo, hi)
        assert_feasible(b_thr, M, total, lo, hi)
        assert A.total_value(fn, b_thr) == pytest.approx(A.total_value(fn, b_heap), rel=1e-9)


def test_threshold_when_gains_are_equal_to_float_precision():
    # k = 1e-17: e^{-kB} rounds to 1 for every B, so each prompt's gains are one float value and
    # bisection cannot split them; the solver lists them all and picks the largest
    C, k = np.array([1.0, 3.0, 2.0, 3.0]), np.full(4, 1e-17)
    fn = exp_value(C, k)
    b = A.allocate_threshold(C, k, 30, 2, 10)
    assert_feasible(b, 4, 30, 2, 10)
    # V ~ C k B is linear: prompts 1 and 3 (C = 3) first to B_up = 10, then prompt 2 (C = 2): 2+10+8+10
    assert b == [2, 10, 8, 10]
    assert A.total_value(fn, b) == pytest.approx(A.total_value(fn, A.allocate(fn, 4, 30, 2, 10)), rel=1e-9)


def test_threshold_float_ties_with_huge_budget_do_not_list_every_unit():
    # k = 1e-25, B_up = 10^9: k B <= 1e-16, so each prompt's 10^9 gains are one float value. The
    # solver must not build a 10^9-long candidate list: C = 3 prompts fill to B_up first, then the
    # C = 2 prompt takes the R - 2 (10^9 - 2) = 3 units left, prompt 0 (C = 1) stays at B_low.
    C, k = np.array([1.0, 3.0, 2.0, 3.0]), np.full(4, 1e-25)
    total = 2 + 10 ** 9 + 5 + 10 ** 9
    assert A.allocate_threshold(C, k, total, 2, 10 ** 9) == [2, 10 ** 9, 5, 10 ** 9]


def test_threshold_huge_budget_is_exchange_optimal():
    # B_up = 10^9: far beyond a heap or DP. For separable concave V an allocation is optimal iff no
    # single unit moved from j to i gains: gain_i(B_i) <= gain_j(B_j - 1) (checked in logs)
    rng = np.random.default_rng(9)
    M, lo, hi, total = 6, 2, 10 ** 9, 3 * 10 ** 9
    C, k = rng.gamma(2.0, size=M), rng.uniform(1e-9, 1e-8, size=M)
    b = np.array(A.allocate_threshold(C, k, total, lo, hi))
    assert b.sum() == total and b.min() >= lo and b.max() <= hi
    log_gain = lambda B: np.log(C * -np.expm1(-k)) - k * B  # noqa: E731  log of C e^{-kB}(1 - e^{-k})
    next_gain = np.where(b < hi, log_gain(b), -np.inf)     # (M,) what one more unit would add
    last_gain = np.where(b > lo, log_gain(b - 1), np.inf)  # (M,) what the last unit added
    assert next_gain.max() <= last_gain.min() + 1e-12


def test_threshold_zero_gain_prompts_take_what_live_prompts_cannot_hold():
    # Prompt 0 is the only one with a positive gain (C = 0 kills prompt 1, k = 0 prompt 2):
    # B_low = 1, total 8 -> prompt 0 to B_up = 3, 3 units left over prompts 1, 2 evenly: 2+1 extra
    assert A.allocate_threshold([1.0, 0.0, 2.0], [0.5, 0.3, 0.0], 8, 1, 3) == [3, 3, 2]
    # with room to spare the zero-gain prompts stay at B_low
    assert A.allocate_threshold([1.0, 0.0, 2.0], [0.5, 0.3, 0.0], 5, 1, 3) == [3, 1, 1]


def test_threshold_on_eq9_coefficients_equals_heap_on_eq9():
    coba = pytest.importorskip("coba")
    p = np.random.default_rng(10).binomial(16, np.random.default_rng(11).beta(0.7, 0.9, 256)) / 16
    tau = coba.adaptive_tau(p)
    for alpha_t, beta_t in [(5.5, 5.5), (9.0, 2.0), (1.5, 9.5)]:
        C, k = coba.capability_value_coeffs(p, alpha_t, beta_t, tau)
        fn = lambda B: coba.capability_value(B, p, alpha_t, beta_t, tau)  # noqa: E731
        b_thr, b_heap = A.allocate_threshold(C, k, 4096, 2, 128), A.allocate(fn, 256, 4096, 2, 128)
        assert A.total_value(fn, b_thr) == pytest.approx(A.total_value(fn, b_heap), rel=1e-9)


# ----------------------------------------------------------------------------------------------
# Errors: infeasible, negative, NaN
# ----------------------------------------------------------------------------------------------
def test_infeasible_budgets_raise_one_line_errors_naming_the_fix():
    with pytest.raises(ValueError, match=r"total budget 10 < 8 prompts x min budget 2 = 16: raise --total-budget"):
        A.check_feasible(8, 10, 2, 128)
    with pytest.raises(ValueError, match=r"total budget 2000 > 8 prompts x max budget 128 = 1024: lower"):
        A.check_feasible(8, 2000, 2, 128)
    with pytest.raises(ValueError, match="min budget 5 > max budget 3"):
        A.check_feasible(2, 8, 5, 3)
    with pytest.raises(ValueError, match="at least one prompt"):
        A.check_feasible(0, 0, 2, 4)
    with pytest.raises(ValueError, match="must be an integer"):
        A.check_feasible(4, 16.5, 2, 8)
    table = concave_table(np.random.default_rng(0), 4, 8)
    for solver in (A.allocate, A.allocate_dp, A.allocate_brute_force):
        with pytest.raises(ValueError, match="raise --total-budget"):
            solver(table, 4, 7, 2, 8)
    with pytest.raises(ValueError, match="lower --total-budget"):
        A.allocate_threshold(np.ones(4), np.ones(4), 33, 2, 8)
    with pytest.raises(ValueError, match="raise --total-budget"):
        A.allocate_budgets("uniform", np.full(4, 0.5), np.zeros(4, bool), 7, 2, 8, 5.5, 5.5, 6.0)


def test_negative_or_nan_values_raise():
    table = concave_table(np.random.default_rng(0), 3, 6)
    bad_nan, bad_neg = table.copy(), table.copy()
    bad_nan[1, 4], bad_neg[2, 3] = np.nan, -0.5
    for solver in (A.allocate, A.allocate_dp):
        with pytest.raises(ValueError, match="NaN"):
            solver(bad_nan, 3, 12, 2, 6)
        with pytest.raises(ValueError, match="negative"):
            solver(bad_neg, 3, 12, 2, 6)
        with pytest.raises(ValueError, match="NaN"):
            solver(lambda B: np.full(3, np.nan), 3, 12, 2, 6)
    with pytest.raises(ValueError, match="negative"):
        A.allocate_threshold([1.0, -1.0], [0.1, 0.1], 6, 2, 4)
    with pytest.raises(ValueError, match="NaN"):
        A.allocate_threshold([1.0, 1.0], [0.1, np.nan], 6, 2, 4)
    with pytest.raises(ValueError, match="pass rates"):
        A.allocate_budgets("coba", [0.5, np.nan], [True, True], 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="pass rates"):
        A.allocate_budgets("coba", [0.5, 1.5], [True, True], 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="shape"):
        A.allocate(np.ones((3, 4)), 3, 12, 2, 6)  # table too short for B_up = 6


def test_unknown_allocator_or_solver_names_the_accepted_ones():
    assert A.ALLOCATORS == ("uniform", "knapsack", "coba", "coba-released")
    with pytest.raises(ValueError, match="uniform, knapsack, coba, coba-released"):
        A.allocate_budgets("grpo", np.full(2, 0.5), np.ones(2, bool), 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="heap, threshold"):
        A.allocate_budgets("coba", np.full(2, 0.5), np.ones(2, bool), 8, 2, 4, 5.5, 5.5, 6.0, solver="dp")


# ----------------------------------------------------------------------------------------------
# Dispatcher: uniform, first epoch, knapsack, coba
# ----------------------------------------------------------------------------------------------
def test_uniform_spreads_the_remainder_one_each():
    assert A.uniform_budgets(4, 10) == [3, 3, 2, 2]  # 10 = 4 x 2 + 2
    assert A.uniform_budgets(3, 12) == [4, 4, 4]


@pytest.mark.parametrize("allocator", A.ALLOCATORS)
def test_all_unseen_batch_is_uniform(allocator):
    # docs/method-sources.md §3: a p_i exists only from an earlier visit; the first epoch is uniform
    p = np.array([0.0, 0.2, 0.5, 0.9])  # ignored: nothing seen yet
    assert A.allocate_budgets(allocator, p, np.zeros(4, bool), 10, 2, 8, 5.5, 5.5, 6.0) == [3, 3, 2, 2]


@pytest.mark.parametrize("allocator", A.ALLOCATORS)
@pytest.mark.parametrize("solver", A.SOLVERS)
def test_dispatcher_constraints_hold_on_random_batches(allocator, solver):
    pytest.importorskip("coba")
    rng = np.random.default_rng(12)
    for _ in range(25):
        M, total, lo, hi = random_case(rng)
        p = rng.binomial(8, rng.beta(0.7, 0.9, size=M)) / 8  # many exact 0 and 1
        seen = rng.random(M) < 0.8
        b = A.allocate_budgets(allocator, p, seen, total, lo, hi, float(rng.uniform(1, 10)), 5.0, 6.0, solver=solver)
        assert_feasible(b, M, total, lo, hi)


def test_coba_heap_and_threshold_solvers_agree():
    coba = pytest.importorskip("coba")
    p = np.random.default_rng(13).beta(0.7, 0.9, size=64)
    tau = coba.adaptive_tau(p)
    args = (p, np.ones(64, bool), 512, 2, 32, 7.26, 3.74, tau)  # Figure 4's (alpha, beta) = (7.26, 3.74)
    b_heap, b_thr = A.allocate_budgets("coba", *args), A.allocate_budgets("coba", *args, solver="threshold")
    fn = lambda B: coba.capability_value(B, p, 7.26, 3.74, tau)  # noqa: E731
    assert A.total_value(fn, b_thr) == pytest.approx(A.total_value(fn, b_heap), rel=1e-9)


# ----------------------------------------------------------------------------------------------
# Knapsack-RL's published allocator (liziniu/KnapsackRL exploration_utils.py), `--allocator knapsack`
# ----------------------------------------------------------------------------------------------
def test_knapsack_issue_example_sends_the_unused_budget_to_the_unsolved_prompt():
    # issue 12, item 4: p = [0, .5, .5, 1], B_total 32, B in [2, 128]. Every prompt starts at B_low = 2
    # (R = 24 left). The two p = .5 prompts' cost cap: int(ln 0.1 / ln 0.5) = int(3.32) = 3 each, so
    # the knapsack may use 6 units: 3 each -> 5, 5. The other 18 (the fallback) go to the p = 0
    # prompt: 2 + 18 = 20. The value-only heap this replaced gave [2, 14, 14, 2].
    b = A.allocate_budgets("knapsack", [0, .5, .5, 1], np.ones(4, bool), 32, 2, 128, 5.5, 5.5, 6.0)
    assert b == [20, 5, 5, 2]
    assert A.allocate_knapsack([0, .5, .5, 1], np.ones(4, bool), 32, 2, 128) == [20, 5, 5, 2]


def test_knapsack_cost_cap():
    # int(min(B_up, ln 0.1 / ln max(p, 1-p))): p = .5 -> 3.32 -> 3; p = .1 or .9 -> 21.85 -> 21;
    # p = .01 -> 229.1, capped at B_up = 128
    # exact: integers (caps), not near a rounding boundary
    np.testing.assert_array_equal(A.knapsack_cost_cap([.5, .1, .9, .01], 128), [3, 21, 21, 128])


def test_knapsack_validity_rule_and_stats():
    # knapsack_stats = (p_hat, rollouts recorded). A prompt with < 8 recorded rollouts is not valid:
    # it gets G = B_total / M = 8 and stays out of the knapsack, whatever its p_hat. Invalid prompts
    # also count as unsolved for the fallback (the official reads p = 0 from an array it leaves at 0
    # for them). Here: prompt 2 (p_hat .5 but 4 rollouts) and 3 (unseen) are invalid -> 8 each;
    # prompts 0, 1 valid at p = .5 -> 2 each. R = 32 - 20 = 12; caps 3 + 3 = 6 < 12, so the
    # knapsack gets 6 (3 each -> 5, 5) and the fallback 6 goes evenly to prompts 2 and 3: 11, 11.
    stats = (np.array([.5, .5, .5, 0.0]), np.array([16, 8, 4, 0]))
    b = A.allocate_budgets("knapsack", [.5, .5, .5, .5], np.array([1, 1, 1, 0], bool), 32, 2, 128,
                           5.5, 5.5, 6.0, knapsack_stats=stats)
    assert b == [5, 5, 11, 11]
    # without stats (the old call): p_hat = pass rates, valid = seen -> prompt 3 (unseen) gets G = 8;
    # R = 32 - 14 = 18 > caps 9: the fallback (9) goes to prompt 3, the only "p = 0" (invalid) one
    assert A.allocate_budgets("knapsack", [.5, .5, .5, .5], np.array([1, 1, 1, 0], bool), 32, 2, 128,
                              5.5, 5.5, 6.0) == [5, 5, 5, 17]


def test_knapsack_objective_counts_only_units_above_the_minimum():
    # solve_by_dp's objective: Value(B_i, p_i) only for prompts given >= 1 unit above B_low, 0 for
    # those left at B_low. Two prompts, p = .5 and .9, 1 unit to place above B_low = 2:
    #   to p = .5: Value(3, .5) = (1 - 2 x .125) x .5 x .25 = .09375
    #   to p = .9: Value(3, .9) = (1 - .729 - .001) x .9 x .01 = .00243
    # (the plain value would compare gains .03125 and .0009 instead: same winner here, but only the
    # counted objective matches the DP below)
    assert A._knapsack_units(np.array([.5, .9]), 1, 2, 6) == [3, 2]
    rng = np.random.default_rng(3)
    for case in range(80):  # the heap on the counted objective equals the exact DP (concave for B_low >= 1)
        M, lo = int(rng.integers(1, 7)), int(rng.integers(0, 3))
        hi = lo + int(rng.integers(1, 10))
        p = rng.integers(1, 16, size=M) / 16
        units = int(rng.integers(0, M * (hi - lo) + 1))
        f = lambda B, p=p, lo=lo: np.where(np.asarray(B) > lo, coba_knapsack_value(B, p), 0.0)  # noqa: E731
        b = A._knapsack_units(p, units, lo, hi)
        assert_feasible(b, M, M * lo + units, lo, hi)
        best = A.total_value(f, A.allocate_dp(f, M, M * lo + units, lo, hi))
        assert A.total_value(f, b) == pytest.approx(best, abs=1e-12), case


def coba_knapsack_value(B, p):
    coba = pytest.importorskip("coba")
    return coba.knapsack_value(B, p)


def test_knapsack_where_the_official_code_breaks_we_keep_the_constraints():
    # (a) tight B_up: p = [0, .5], B in [2, 4], B_total 8, R = 4. Caps: int(min(4, 3.32)) = 3 < 4, so
    # the official sends 1 to p = 0 and asks its DP for 3 units above B_low, but one prompt holds only
    # 2; it spreads the 3rd over the informative prompts anyway: [3, 5], above B_up. Ours: the knapsack
    # gets what fits (2), the fallback the rest (2): [4, 4].
    assert A.allocate_knapsack([0, .5], np.ones(2, bool), 8, 2, 4) == [4, 4]
    # (b) every prompt informative and a surplus above the caps (3 + 3 < 28): the official divides by
    # zero (no fallback prompt); ours gives the knapsack all R = 28 -> 16 each (symmetric optimum)
    assert A.allocate_knapsack([.5, .5], np.ones(2, bool), 32, 2, 128) == [16, 16]
    # (c) no informative prompt and no p = 0 prompt: the official sets every prompt to G = 32 // 3 = 10
    # (sum 30 < 32); ours is uniform_budgets
    assert A.allocate_knapsack([1, 1, 1], np.ones(3, bool), 32, 2, 128) == [11, 11, 10]


# ----------------------------------------------------------------------------------------------
# Released code's hybrid (`coba-released`) vs the paper's Algorithm 1 (`coba`)
# ----------------------------------------------------------------------------------------------
def test_coba_released_issue_example():
    # issue 12, item 4: p = [.5625, 0, .4375, 1], B_total 32, B in [2, 128], alpha_t 6.4 (beta_t 4.6).
    # Heap: p = .5625, .4375 (2 of 4, not > half): share .6 + (.8 - .6) x 2 x .5 = .8 of R = 24 ->
    # int(19.2) = 19 units. tau over the heap's two prompts: Var = .0039 -> 3 + 9 x .0039 / .1667
    # = 3.21 (over all 4 it would be 9.59). Algorithm 1 gives 12 and 7 extra. The 5 left go to the
    # very hard p = 0 prompt: 2 + 5 = 7.
    p = [.5625, 0, .4375, 1]
    assert A.allocate_budgets("coba-released", p, np.ones(4, bool), 32, 2, 128, 6.4, 4.6, "adaptive") == [14, 7, 9, 2]
    # the old version took tau over all M (9.59), which moves most of the heap's units to p = .5625
    coba = pytest.importorskip("coba")
    assert A.allocate_released(p, 32, 2, 128, 6.4, 4.6, coba.adaptive_tau(np.array(p))) == [20, 7, 3, 2]


def test_coba_vs_coba_released_on_a_fixed_batch():
    # Documentation: 8 prompts, G = 8 (B_total 64), B in [2, 32], (alpha_t, beta_t) = (5.5, 5.5).
    coba = pytest.importorskip("coba")
    p = np.array([0.0, 0.03, 0.2, 0.4, 0.5, 0.7, 0.95, 1.0])
    assert coba.adaptive_tau(p) == pytest.approx(10.002, abs=1e-3)  # over all 8: coba's tau
    args = (p, np.ones(8, bool), 64, 2, 32, 5.5, 5.5, "adaptive")
    # Algorithm 1: all 48 surplus units go to the two prompts nearest the density's peak p = 0.5;
    # p = 0 and 0.03 stay at 2 rollouts (docs/calibration.md's "sticky zero").
    assert A.allocate_budgets("coba", *args) == [2, 2, 2, 22, 30, 2, 2, 2]
    # Hybrid: p = 0, 0.03 (very hard) and 1.0 (very easy) stay out of the heap. 5 of 8 prompts are
    # in it (> half) -> 0.8 x 48 = 38.4 -> 38 units by Algorithm 1 with tau over those 5 (6.56):
    # 16 to p = .4, 22 to p = .5. The 10 left go to the very hard prompts, weights 1 - p (p clipped
    # to [1e-6, 1 - 1e-6]) .999999 and .97: int(10 x .999999 / 1.969999) = 5 (5 left), then
    # int(5 x .97 / 1.969999) = 2 (3 left: `left` shrank before the second share); one even pass:
    # 2 and 1 -> 7 and 3 extra.
    assert coba.adaptive_tau(p[2:7]) == pytest.approx(6.563, abs=1e-3)
    assert A.allocate_budgets("coba-released", *args) == [9, 5, 2, 18, 24, 2, 2, 2]


def test_released_heap_share_formula():
    # 2 of 8 prompts in the heap (share 1/4 <= 1/2): 0.6 + 0.2 x 2 x 0.25 = 0.7 of the 48 surplus
    # -> int(33.6) = 33 units to the heap; 15 left to the three p = 0 prompts, equal weights w:
    # int(15 w / 3w) = int(4.99999...) = 4 in floating point (10 + 1 left), int(11/3) = 3, int(8/3) = 2,
    # then the even pass of the last 6: 2 each -> 6, 5, 4 extra. Exact thirds would be 5, 5, 5.
    p = np.array([0.0, 0.0, 0.0, 0.3, 0.6, 1.0, 1.0, 1.0])
    b = A.allocate_released(p, 64, 2, 64, 5.5, 5.5, 6.0)
    assert b[:3] == [8, 7, 6] and b[5:] == [2, 2, 2] and b[3] + b[4] == 2 + 2 + 33
    # no prompt in the heap: all 48 go to the very hard, weights .999999 and .98 (W = 1.979999):
    # int(48 x .999999 / W) = 24 (24 left), int(24 x .98 / W) = 11 (13 left), even pass 7, 6
    # -> 31 and 17 extra; an exact proportional split would give 24 and 24.
    b = A.allocate_released(np.array([0.0, 0.02, 1.0, 1.0]), 56, 2, 64, 5.5, 5.5, 6.0)
    assert b == [2 + 31, 2 + 17, 2, 2]


def test_released_never_loops_when_the_heap_share_exceeds_capacity():
    # docs/calibration.md: "A hybrid allocator whose heap share exceeds what its prompts can hold at
    # B_max looped forever." 5 mid prompts + 3 very hard, B in [2, 4], B_total 30: surplus 14,
    # 5 of 8 in the heap -> 0.8 x 14 = 11 units, but 5 prompts x (4 - 2) = 10 fit (the released heap
    # stops there too). The 4 left go to the very hard ones, weights .999999, .99, .98 (W = 2.969999):
    # int(4 x .999999 / W) = 1 (3 left), int(3 x .99 / W) = 1 (2 left), int(2 x .98 / W) = 0; the even
    # pass gives the last 2 to the first two: 4, 4, 2.
    p = np.array([0.3, 0.4, 0.5, 0.6, 0.7, 0.0, 0.01, 0.02])
    assert A.allocate_released(p, 30, 2, 4, 5.5, 5.5, 6.0) == [4, 4, 4, 4, 4, 4, 4, 2]
    assert A.allocate_released(p, 32, 2, 4, 5.5, 5.5, 6.0) == [4] * 8  # total = M x B_up: all full
    # all mid-p prompts with a tight B_up: the heap holds everything
    p = np.linspace(0.2, 0.8, 16)
    b = A.allocate_released(p, 16 * 3 + 5, 2, 4, 5.5, 5.5, 6.0)
    assert_feasible(b, 16, 53, 2, 4)


def test_released_caps_binding_drop_no_budget():
    # p = 0, 0, 0 (all very hard), B in [2, 5], B_total 15 = M x B_up, surplus 9. Weighted pass:
    # int(9/3) = 2 in floating point (int(8.99.../3)), int(7/3) = 2, int(5/3) = 1 -> 4, 4, 3; even pass
    # of the last 4: 2, 1, 1 capped at B_up = 5 -> 5, 5, 4 and one unit left. The released code ends
    # there (sum 14 < 15); ours runs the passes again: 5, 5, 5.
    assert A.allocate_released(np.zeros(3), 15, 2, 5, 5.5, 5.5, "adaptive") == [5, 5, 5]


# ----------------------------------------------------------------------------------------------
# The benchmark runs (tiny sizes here; `python allocate.py --bench` for Table 4 scale)
# ----------------------------------------------------------------------------------------------
def test_bench_runs_and_objectives_agree(capsys):
    pytest.importorskip("coba")
    rows = A.bench(repeats=1, sizes=[(16, 128, 2, 32), (64, 1024, 2, 64)])
    assert all(r["agree"] for r in rows)
    assert "DP/heap" in capsys.readouterr().out


def test_knapsack_invalid_prompts_get_the_default_budget():
    """Knapsack-RL: a prompt with < 8 recorded rollouts gets the default n (G) and stays out; the
    default can be set (mutation testing found `default_budget` untested)."""
    # the valid prompts (p = 0.9: cost cap int(ln 0.1 / ln 0.9) = 21 -> B_up 16) absorb the whole
    # surplus, so no fallback reaches the invalid ones
    p, valid = [0.5, 0.5, 0.9, 0.9], [False, False, True, True]
    b = A.allocate_knapsack(p, valid, 32, 2, 16, default_budget=6)
    assert b[:2] == [6, 6] and sum(b) == 32 and all(2 <= x <= 16 for x in b)
    assert A.allocate_knapsack(p, valid, 32, 2, 16)[:2] == [8, 8]  # default: B_total // M
    with pytest.raises(ValueError, match="default budget"):
        A.allocate_knapsack(p, valid, 32, 2, 16, default_budget=20)
