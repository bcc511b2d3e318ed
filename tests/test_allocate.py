"""Tests of allocate.py and its speed-ups: Algorithm 1 (paper §2.4) against the exact DP and a brute
force, the lazy heap training calls (speedups/lazy_heap.py) against Algorithm 1, our threshold solver
(speedups/threshold.py) against the heap, eq. 3's checks, and the Table 4 benchmark. The other
arms' allocators and the dispatcher: tests/test_allocators.py.

Optimal allocations need not be unique (ties), so solvers are compared by objective
sum_i V_i(B_i), never by vector; exact vectors appear only where they document a behaviour (and
where two solvers make the same pops: the lazy heap and Algorithm 1).

Run: cd /work/main && python -m pytest -q tests/test_allocate.py   (a few seconds, no model needed)
"""
import itertools
import math

import numpy as np
import pytest

import allocate as A
from speedups.lazy_heap import allocate_lazy, bench
from speedups.threshold import allocate_threshold


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



def brute_force(value_fn, num_prompts, total_budget, min_budget, max_budget, step=1):
    """Every allocation, for tiny cases ((D+1)^M <= 10^6): a reference for the reference (the DP)."""
    M, R, D = A.budget_grid(num_prompts, total_budget, min_budget, max_budget, step)
    T = A.value_columns(value_fn, M, min_budget, max_budget, step, 0, D + 1)  # (M, D+1)
    assert (D + 1) ** M <= 10 ** 6, "brute force is for tiny cases"
    best, best_js = -math.inf, None
    for js in itertools.product(range(D + 1), repeat=M):
        if sum(js) == R:
            v = sum(T[i, j] for i, j in enumerate(js))
            if v > best:
                best, best_js = v, js
    return [int(min_budget) + step * j for j in best_js]


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
        best = A.total_value(table, brute_force(table, M, total, lo, hi))
        assert A.total_value(table, A.allocate(table, M, total, lo, hi)) == pytest.approx(best, abs=1e-9)
        assert A.total_value(table, A.allocate_dp(table, M, total, lo, hi)) == pytest.approx(best, abs=1e-9)


def test_heap_small_example_by_hand():
    # gains: prompt 0: 5, 1, 1; prompt 1: 3, 2, 0. B_low = 0, 3 units: take 5 (p0), 3 (p1), 2 (p1)
    table = np.array([[0, 5, 6, 7], [0, 3, 5, 5]], dtype=float)
    assert A.allocate(table, 2, 3, 0, 3) == [1, 2]  # value 5 + 5 = 10
    assert A.total_value(table, A.allocate_dp(table, 2, 3, 0, 3)) == 10.0  # exact: integer-valued gains: a sum of integers


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
    assert brute_force(table, 2, 3, 0, 3) == [3, 0]
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
# Speed-up: the lazy heap (what training calls) makes Algorithm 1's pops
# ----------------------------------------------------------------------------------------------
def test_lazy_heap_equals_algorithm_1_and_the_dp_on_random_cases():
    # same pops, hence the same vector as Algorithm 1 (ties included); on concave values both reach
    # the DP's objective (App. A, Prop. 2.2), on arbitrary values they are the same heuristic
    rng = np.random.default_rng(20)
    for case in range(250):
        M, total, lo, hi = random_case(rng)
        concave = case % 5 != 4
        table = concave_table(rng, M, hi, ties=case % 3 == 0) if concave else rng.uniform(0, 1, size=(M, hi + 1))
        b_lazy, b_heap = allocate_lazy(table, M, total, lo, hi), A.allocate(table, M, total, lo, hi)
        assert_feasible(b_lazy, M, total, lo, hi)
        assert b_lazy == b_heap, case
        if concave:
            v_dp = A.total_value(table, A.allocate_dp(table, M, total, lo, hi))
            assert A.total_value(table, b_lazy) == pytest.approx(v_dp, abs=1e-9), case


def test_lazy_heap_equals_algorithm_1_on_eq9_with_steps_and_wide_ranges():
    # value functions (train.py's call), a step > 1, and B_up far above the even share, where the
    # lazy heap extends its table several times
    rng = np.random.default_rng(21)
    for M, total, lo, hi, step in [(8, 64, 2, 64, 1), (16, 512, 2, 256, 1), (5, 40, 2, 40, 2), (64, 512, 0, 128, 1)]:
        C, k = random_coeffs(rng, M, "plain")
        fn = exp_value(C, k)
        assert allocate_lazy(fn, M, total, lo, hi, step) == A.allocate(fn, M, total, lo, hi, step)


def test_lazy_heap_work_does_not_grow_with_max_budget():
    # the lazy heap evaluates budget levels only as deep as the deepest prompt goes (doubling), never
    # the whole (M, B_up + 1) table: here 4 prompts, 64 rollouts, B_up = 10^6 -> a few dozen levels
    C, k = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.05, 0.1, 0.2, 0.4])
    calls = []

    def value(B):
        calls.append(int(B[0]))  # one call per budget level (vectorised over prompts)
        assert len(calls) <= 200, "the heap evaluated far more budget levels than any prompt can use"
        return C * -np.expm1(-k * B)

    b = allocate_lazy(value, 4, 64, 2, 10 ** 6)
    assert len(calls) <= 2 * (max(b) - 2) + 9  # levels 0..depth, depth < 2 x the deepest prompt (or 8)
    ref = A.allocate(exp_value(C, k), 4, 64, 2, 100)  # Algorithm 1 with a narrow B_up: same pops
    assert b == ref and sum(b) == 64


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
        b_thr, b_heap = allocate_threshold(C, k, total, lo, hi), A.allocate(fn, M, total, lo, hi)
        assert_feasible(b_thr, M, total, lo, hi)
        v_thr, v_heap = A.total_value(fn, b_thr), A.total_value(fn, b_heap)
        assert v_thr == pytest.approx(v_heap, rel=1e-9, abs=1e-300)


def test_threshold_equals_heap_at_paper_scale_and_large_budgets():
    rng = np.random.default_rng(8)
    for M, total, lo, hi in [(512, 8192, 2, 128), (5, 60_000, 2, 20_000), (40, 80 * 1000, 2, 4000)]:
        C, k = rng.gamma(2.0, size=M), rng.uniform(1e-4, 0.09, size=M)
        fn = exp_value(C, k)
        b_thr, b_heap = allocate_threshold(C, k, total, lo, hi), A.allocate(fn, M, total, lo, hi)
        assert_feasible(b_thr, M, total, lo, hi)
        assert A.total_value(fn, b_thr) == pytest.approx(A.total_value(fn, b_heap), rel=1e-9)


def test_threshold_when_gains_are_equal_to_float_precision():
    # k = 1e-17: e^{-kB} rounds to 1 for every B, so each prompt's gains are one float value and
    # bisection cannot split them; the solver lists them all and picks the largest
    C, k = np.array([1.0, 3.0, 2.0, 3.0]), np.full(4, 1e-17)
    fn = exp_value(C, k)
    b = allocate_threshold(C, k, 30, 2, 10)
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
    assert allocate_threshold(C, k, total, 2, 10 ** 9) == [2, 10 ** 9, 5, 10 ** 9]


def test_threshold_huge_budget_is_exchange_optimal():
    # B_up = 10^9: far beyond a heap or DP. For separable concave V an allocation is optimal iff no
    # single unit moved from j to i gains: gain_i(B_i) <= gain_j(B_j - 1) (checked in logs)
    rng = np.random.default_rng(9)
    M, lo, hi, total = 6, 2, 10 ** 9, 3 * 10 ** 9
    C, k = rng.gamma(2.0, size=M), rng.uniform(1e-9, 1e-8, size=M)
    b = np.array(allocate_threshold(C, k, total, lo, hi))
    assert b.sum() == total and b.min() >= lo and b.max() <= hi
    log_gain = lambda B: np.log(C * -np.expm1(-k)) - k * B  # noqa: E731  log of C e^{-kB}(1 - e^{-k})
    next_gain = np.where(b < hi, log_gain(b), -np.inf)     # (M,) what one more unit would add
    last_gain = np.where(b > lo, log_gain(b - 1), np.inf)  # (M,) what the last unit added
    assert next_gain.max() <= last_gain.min() + 1e-12


def test_threshold_zero_gain_prompts_take_what_live_prompts_cannot_hold():
    # Prompt 0 is the only one with a positive gain (C = 0 kills prompt 1, k = 0 prompt 2):
    # B_low = 1, total 8 -> prompt 0 to B_up = 3, 3 units left over prompts 1, 2 evenly: 2+1 extra
    assert allocate_threshold([1.0, 0.0, 2.0], [0.5, 0.3, 0.0], 8, 1, 3) == [3, 3, 2]
    # with room to spare the zero-gain prompts stay at B_low
    assert allocate_threshold([1.0, 0.0, 2.0], [0.5, 0.3, 0.0], 5, 1, 3) == [3, 1, 1]


def test_threshold_on_eq9_coefficients_equals_heap_on_eq9():
    coba = pytest.importorskip("coba")
    p = np.random.default_rng(10).binomial(16, np.random.default_rng(11).beta(0.7, 0.9, 256)) / 16
    tau = coba.adaptive_tau(p)
    for alpha_t, beta_t in [(5.5, 5.5), (9.0, 2.0), (1.5, 9.5)]:
        C, k = coba.capability_value_coeffs(p, alpha_t, beta_t, tau)
        fn = lambda B: coba.capability_value(B, p, alpha_t, beta_t, tau)  # noqa: E731
        b_thr, b_heap = allocate_threshold(C, k, 4096, 2, 128), A.allocate(fn, 256, 4096, 2, 128)
        assert A.total_value(fn, b_thr) == pytest.approx(A.total_value(fn, b_heap), rel=1e-9)


# ----------------------------------------------------------------------------------------------
# Errors: infeasible, negative, NaN
# ----------------------------------------------------------------------------------------------
def test_infeasible_budgets_raise_one_line_errors_in_eq_3s_terms():
    with pytest.raises(ValueError, match=r"^B_total = 10 < M x B_low = 8 x 2 = 16: eq. 3 is infeasible$"):
        A.check_feasible(8, 10, 2, 128)
    with pytest.raises(ValueError, match=r"^B_total = 2000 > M x B_up = 8 x 128 = 1024: eq. 3 is infeasible$"):
        A.check_feasible(8, 2000, 2, 128)
    with pytest.raises(ValueError, match="B_low = 5 > B_up = 3"):
        A.check_feasible(2, 8, 5, 3)
    with pytest.raises(ValueError, match="B_low = -1 < 0"):
        A.check_feasible(2, 8, -1, 3)
    with pytest.raises(ValueError, match="at least one prompt"):
        A.check_feasible(0, 0, 2, 4)
    with pytest.raises(ValueError, match="B_total must be an integer"):
        A.check_feasible(4, 16.5, 2, 8)
    table = concave_table(np.random.default_rng(0), 4, 8)
    for solver in (A.allocate, allocate_lazy, A.allocate_dp, brute_force):
        with pytest.raises(ValueError, match="B_total = 7 < M x B_low"):
            solver(table, 4, 7, 2, 8)
    with pytest.raises(ValueError, match="B_total = 33 > M x B_up"):
        allocate_threshold(np.ones(4), np.ones(4), 33, 2, 8)


def test_negative_or_nan_values_raise():
    table = concave_table(np.random.default_rng(0), 3, 6)
    bad_nan, bad_neg = table.copy(), table.copy()
    bad_nan[1, 4], bad_neg[2, 3] = np.nan, -0.5
    for solver in (A.allocate, allocate_lazy, A.allocate_dp):
        with pytest.raises(ValueError, match="NaN"):
            solver(bad_nan, 3, 12, 2, 6)
        with pytest.raises(ValueError, match="negative"):
            solver(bad_neg, 3, 12, 2, 6)
        with pytest.raises(ValueError, match="NaN"):
            solver(lambda B: np.full(3, np.nan), 3, 12, 2, 6)
    with pytest.raises(ValueError, match="negative"):
        allocate_threshold([1.0, -1.0], [0.1, 0.1], 6, 2, 4)
    with pytest.raises(ValueError, match="NaN"):
        allocate_threshold([1.0, 1.0], [0.1, np.nan], 6, 2, 4)
    with pytest.raises(ValueError, match="shape"):
        A.allocate(np.ones((3, 4)), 3, 12, 2, 6)  # table too short for B_up = 6
    with pytest.raises(ValueError, match="shape"):
        allocate_lazy(np.ones((3, 4)), 3, 6, 2, 6)  # checked even with nothing to hand out



def test_uniform_spreads_the_remainder_one_each():
    assert A.uniform_budgets(4, 10) == [3, 3, 2, 2]  # 10 = 4 x 2 + 2
    assert A.uniform_budgets(3, 12) == [4, 4, 4]



# ----------------------------------------------------------------------------------------------
# The benchmark runs (tiny sizes here; `python bench.py allocate` for Table 4 scale)
# ----------------------------------------------------------------------------------------------
def test_bench_runs_and_objectives_agree(capsys):
    pytest.importorskip("coba")
    rows = bench(repeats=1, sizes=[(16, 128, 2, 32), (64, 1024, 2, 64)])
    assert all(r["agree"] for r in rows)
    assert "DP/heap" in capsys.readouterr().out


