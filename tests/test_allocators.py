"""Tests of the other arms' allocators and the dispatcher: Knapsack-RL's (arms/knapsack.py), the
released code's hybrid (arms/released.py) and `--allocator`'s table (arms/allocators.py). The
paper's Algorithm 1 and its speed-ups: tests/test_allocate.py.

Run: cd /work/main && python -m pytest -q tests/test_allocators.py   (a few seconds, no model needed)
"""
import numpy as np
import pytest

from arms import allocators as AL
from arms import knapsack, released
from allocate import allocate_dp, total_value
from test_allocate import assert_feasible, random_case


def test_unknown_allocator_or_solver_names_the_accepted_ones():
    assert AL.ALLOCATORS == ("uniform", "knapsack", "coba", "coba-released")
    with pytest.raises(ValueError, match="uniform, knapsack, coba, coba-released"):
        AL.allocate_budgets("grpo", np.full(2, 0.5), np.ones(2, bool), 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="heap, threshold"):
        AL.allocate_budgets("coba", np.full(2, 0.5), np.ones(2, bool), 8, 2, 4, 5.5, 5.5, 6.0, solver="dp")

def test_pass_rates_outside_0_1_or_nan_raise():
    with pytest.raises(ValueError, match="pass rates"):
        AL.allocate_budgets("coba", [0.5, np.nan], [True, True], 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="pass rates"):
        AL.allocate_budgets("coba", [0.5, 1.5], [True, True], 8, 2, 4, 5.5, 5.5, 6.0)
    with pytest.raises(ValueError, match="B_total = 7 < M x B_low"):
        AL.allocate_budgets("uniform", np.full(4, 0.5), np.zeros(4, bool), 7, 2, 8, 5.5, 5.5, 6.0)

# ----------------------------------------------------------------------------------------------
# Dispatcher: first epoch, every arm, coba's two solvers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", AL.ALLOCATORS)
def test_all_unseen_batch_is_uniform(allocator):
    # docs/method-sources.md §3: a p_i exists only from an earlier visit; the first epoch is uniform
    p = np.array([0.0, 0.2, 0.5, 0.9])  # ignored: nothing seen yet
    assert AL.allocate_budgets(allocator, p, np.zeros(4, bool), 10, 2, 8, 5.5, 5.5, 6.0) == [3, 3, 2, 2]


@pytest.mark.parametrize("allocator", AL.ALLOCATORS)
@pytest.mark.parametrize("solver", AL.SOLVERS)
def test_dispatcher_constraints_hold_on_random_batches(allocator, solver):
    pytest.importorskip("coba")
    rng = np.random.default_rng(12)
    for _ in range(25):
        M, total, lo, hi = random_case(rng)
        p = rng.binomial(8, rng.beta(0.7, 0.9, size=M)) / 8  # many exact 0 and 1
        seen = rng.random(M) < 0.8
        b = AL.allocate_budgets(allocator, p, seen, total, lo, hi, float(rng.uniform(1, 10)), 5.0, 6.0, solver=solver)
        assert_feasible(b, M, total, lo, hi)


def test_coba_heap_and_threshold_solvers_agree():
    coba = pytest.importorskip("coba")
    p = np.random.default_rng(13).beta(0.7, 0.9, size=64)
    tau = coba.adaptive_tau(p)
    args = (p, np.ones(64, bool), 512, 2, 32, 7.26, 3.74, tau)  # Figure 4's (alpha, beta) = (7.26, 3.74)
    b_heap, b_thr = AL.allocate_budgets("coba", *args), AL.allocate_budgets("coba", *args, solver="threshold")
    fn = lambda B: coba.capability_value(B, p, 7.26, 3.74, tau)  # noqa: E731
    assert total_value(fn, b_thr) == pytest.approx(total_value(fn, b_heap), rel=1e-9)

# ----------------------------------------------------------------------------------------------
# Knapsack-RL's published allocator (liziniu/KnapsackRL exploration_utils.py), `--allocator knapsack`
# ----------------------------------------------------------------------------------------------
def test_knapsack_worked_example_sends_the_unused_budget_to_the_unsolved_prompt():
    # p = [0, .5, .5, 1], B_total 32, B in [2, 128]. Every prompt starts at B_low = 2
    # (R = 24 left). The two p = .5 prompts' cost cap: int(ln 0.1 / ln 0.5) = int(3.32) = 3 each, so
    # the knapsack may use 6 units: 3 each -> 5, 5. The other 18 (the fallback) go to the p = 0
    # prompt: 2 + 18 = 20. A heap on Knapsack-RL's value alone would give [2, 14, 14, 2].
    b = AL.allocate_budgets("knapsack", [0, .5, .5, 1], np.ones(4, bool), 32, 2, 128, 5.5, 5.5, 6.0)
    assert b == [20, 5, 5, 2]
    assert knapsack.allocate_knapsack([0, .5, .5, 1], np.ones(4, bool), 32, 2, 128) == [20, 5, 5, 2]


def test_knapsack_cost_cap():
    # int(min(B_up, ln 0.1 / ln max(p, 1-p))): p = .5 -> 3.32 -> 3; p = .1 or .9 -> 21.85 -> 21;
    # p = .01 -> 229.1, capped at B_up = 128
    # exact: integers (caps), not near a rounding boundary
    np.testing.assert_array_equal(knapsack.knapsack_cost_cap([.5, .1, .9, .01], 128), [3, 21, 21, 128])


def test_knapsack_validity_rule_and_stats():
    # knapsack_stats = (p_hat, rollouts recorded). A prompt with < 8 recorded rollouts is not valid:
    # it gets G = B_total / M = 8 and stays out of the knapsack, whatever its p_hat. Invalid prompts
    # also count as unsolved for the fallback (the official reads p = 0 from an array it leaves at 0
    # for them). Here: prompt 2 (p_hat .5 but 4 rollouts) and 3 (unseen) are invalid -> 8 each;
    # prompts 0, 1 valid at p = .5 -> 2 each. R = 32 - 20 = 12; caps 3 + 3 = 6 < 12, so the
    # knapsack gets 6 (3 each -> 5, 5) and the fallback 6 goes evenly to prompts 2 and 3: 11, 11.
    stats = (np.array([.5, .5, .5, 0.0]), np.array([16, 8, 4, 0]))
    b = AL.allocate_budgets("knapsack", [.5, .5, .5, .5], np.array([1, 1, 1, 0], bool), 32, 2, 128,
                           5.5, 5.5, 6.0, knapsack_stats=stats)
    assert b == [5, 5, 11, 11]
    # without stats: p_hat = pass rates, valid = seen -> prompt 3 (unseen) gets G = 8;
    # R = 32 - 14 = 18 > caps 9: the fallback (9) goes to prompt 3, the only "p = 0" (invalid) one
    assert AL.allocate_budgets("knapsack", [.5, .5, .5, .5], np.array([1, 1, 1, 0], bool), 32, 2, 128,
                              5.5, 5.5, 6.0) == [5, 5, 5, 17]


def test_knapsack_objective_counts_only_units_above_the_minimum():
    # solve_by_dp's objective: Value(B_i, p_i) only for prompts given >= 1 unit above B_low, 0 for
    # those left at B_low. Two prompts, p = .5 and .9, 1 unit to place above B_low = 2:
    #   to p = .5: Value(3, .5) = (1 - 2 x .125) x .5 x .25 = .09375
    #   to p = .9: Value(3, .9) = (1 - .729 - .001) x .9 x .01 = .00243
    # (the plain value would compare gains .03125 and .0009 instead: same winner here, but only the
    # counted objective matches the DP below)
    assert knapsack._knapsack_units(np.array([.5, .9]), 1, 2, 6) == [3, 2]
    rng = np.random.default_rng(3)
    for case in range(80):  # the heap on the counted objective equals the exact DP (concave for B_low >= 1)
        M, lo = int(rng.integers(1, 7)), int(rng.integers(0, 3))
        hi = lo + int(rng.integers(1, 10))
        p = rng.integers(1, 16, size=M) / 16
        units = int(rng.integers(0, M * (hi - lo) + 1))
        f = lambda B, p=p, lo=lo: np.where(np.asarray(B) > lo, knapsack.knapsack_value(B, p), 0.0)  # noqa: E731
        b = knapsack._knapsack_units(p, units, lo, hi)
        assert_feasible(b, M, M * lo + units, lo, hi)
        best = total_value(f, allocate_dp(f, M, M * lo + units, lo, hi))
        assert total_value(f, b) == pytest.approx(best, abs=1e-9), case  # two solvers' values summed in different orders: rounding only


def test_knapsack_where_the_official_code_breaks_we_keep_the_constraints():
    # (a) tight B_up: p = [0, .5], B in [2, 4], B_total 8, R = 4. Caps: int(min(4, 3.32)) = 3 < 4, so
    # the official sends 1 to p = 0 and asks its DP for 3 units above B_low, but one prompt holds only
    # 2; it spreads the 3rd over the informative prompts anyway: [3, 5], above B_up. Ours: the knapsack
    # gets what fits (2), the fallback the rest (2): [4, 4].
    assert knapsack.allocate_knapsack([0, .5], np.ones(2, bool), 8, 2, 4) == [4, 4]
    # (b) every prompt informative and a surplus above the caps (3 + 3 < 28): the official divides by
    # zero (no fallback prompt); ours gives the knapsack all R = 28 -> 16 each (symmetric optimum)
    assert knapsack.allocate_knapsack([.5, .5], np.ones(2, bool), 32, 2, 128) == [16, 16]
    # (c) no informative prompt and no p = 0 prompt: the official sets every prompt to G = 32 // 3 = 10
    # (sum 30 < 32); ours is uniform_budgets
    assert knapsack.allocate_knapsack([1, 1, 1], np.ones(3, bool), 32, 2, 128) == [11, 11, 10]

def test_knapsack_invalid_prompts_get_the_default_budget():
    """Knapsack-RL: a prompt with < 8 recorded rollouts gets the default n (G) and stays out; the
    default can be set (mutation testing found `default_budget` untested)."""
    # the valid prompts (p = 0.9: cost cap int(ln 0.1 / ln 0.9) = 21 -> B_up 16) absorb the whole
    # surplus, so no fallback reaches the invalid ones
    p, valid = [0.5, 0.5, 0.9, 0.9], [False, False, True, True]
    b = knapsack.allocate_knapsack(p, valid, 32, 2, 16, default_budget=6)
    assert b[:2] == [6, 6] and sum(b) == 32 and all(2 <= x <= 16 for x in b)
    assert knapsack.allocate_knapsack(p, valid, 32, 2, 16)[:2] == [8, 8]  # default: B_total // M
    with pytest.raises(ValueError, match="default budget"):
        knapsack.allocate_knapsack(p, valid, 32, 2, 16, default_budget=20)

# ----------------------------------------------------------------------------------------------
# Released code's hybrid (`coba-released`) vs the paper's Algorithm 1 (`coba`)
# ----------------------------------------------------------------------------------------------
def test_coba_released_worked_example():
    # p = [.5625, 0, .4375, 1], B_total 32, B in [2, 128], alpha_t 6.4 (beta_t 4.6).
    # Heap: p = .5625, .4375 (2 of 4, not > half): share .6 + (.8 - .6) x 2 x .5 = .8 of R = 24 ->
    # int(19.2) = 19 units. tau over the heap's two prompts: Var = .0039 -> 3 + 9 x .0039 / .1667
    # = 3.21 (over all 4 it would be 9.59). Algorithm 1 gives 12 and 7 extra. The 5 left go to the
    # very hard p = 0 prompt: 2 + 5 = 7.
    p = [.5625, 0, .4375, 1]
    assert AL.allocate_budgets("coba-released", p, np.ones(4, bool), 32, 2, 128, 6.4, 4.6, "adaptive") == [14, 7, 9, 2]
    # tau over all M (9.59) instead would move most of the heap's units to p = .5625
    coba = pytest.importorskip("coba")
    assert released.allocate_released(p, 32, 2, 128, 6.4, 4.6, coba.adaptive_tau(np.array(p))) == [20, 7, 3, 2]


def test_coba_vs_coba_released_on_a_fixed_batch():
    # Documentation: 8 prompts, G = 8 (B_total 64), B in [2, 32], (alpha_t, beta_t) = (5.5, 5.5).
    coba = pytest.importorskip("coba")
    p = np.array([0.0, 0.03, 0.2, 0.4, 0.5, 0.7, 0.95, 1.0])
    assert coba.adaptive_tau(p) == pytest.approx(10.002, abs=1e-3)  # over all 8: coba's tau
    args = (p, np.ones(8, bool), 64, 2, 32, 5.5, 5.5, "adaptive")
    # Algorithm 1: all 48 surplus units go to the two prompts nearest the density's peak p = 0.5;
    # p = 0 and 0.03 stay at 2 rollouts (docs/calibration.md's "sticky zero").
    assert AL.allocate_budgets("coba", *args) == [2, 2, 2, 22, 30, 2, 2, 2]
    # Hybrid: p = 0, 0.03 (very hard) and 1.0 (very easy) stay out of the heap. 5 of 8 prompts are
    # in it (> half) -> 0.8 x 48 = 38.4 -> 38 units by Algorithm 1 with tau over those 5 (6.56):
    # 16 to p = .4, 22 to p = .5. The 10 left go to the very hard prompts, weights 1 - p (p clipped
    # to [1e-6, 1 - 1e-6]) .999999 and .97: int(10 x .999999 / 1.969999) = 5 (5 left), then
    # int(5 x .97 / 1.969999) = 2 (3 left: `left` shrank before the second share); one even pass:
    # 2 and 1 -> 7 and 3 extra.
    assert coba.adaptive_tau(p[2:7]) == pytest.approx(6.563, abs=1e-3)
    assert AL.allocate_budgets("coba-released", *args) == [9, 5, 2, 18, 24, 2, 2, 2]


def test_released_heap_share_formula():
    # 2 of 8 prompts in the heap (share 1/4 <= 1/2): 0.6 + 0.2 x 2 x 0.25 = 0.7 of the 48 surplus
    # -> int(33.6) = 33 units to the heap; 15 left to the three p = 0 prompts, equal weights w:
    # int(15 w / 3w) = int(4.99999...) = 4 in floating point (10 + 1 left), int(11/3) = 3, int(8/3) = 2,
    # then the even pass of the last 6: 2 each -> 6, 5, 4 extra. Exact thirds would be 5, 5, 5.
    p = np.array([0.0, 0.0, 0.0, 0.3, 0.6, 1.0, 1.0, 1.0])
    b = released.allocate_released(p, 64, 2, 64, 5.5, 5.5, 6.0)
    assert b[:3] == [8, 7, 6] and b[5:] == [2, 2, 2] and b[3] + b[4] == 2 + 2 + 33
    # no prompt in the heap: all 48 go to the very hard, weights .999999 and .98 (W = 1.979999):
    # int(48 x .999999 / W) = 24 (24 left), int(24 x .98 / W) = 11 (13 left), even pass 7, 6
    # -> 31 and 17 extra; an exact proportional split would give 24 and 24.
    b = released.allocate_released(np.array([0.0, 0.02, 1.0, 1.0]), 56, 2, 64, 5.5, 5.5, 6.0)
    assert b == [2 + 31, 2 + 17, 2, 2]


def test_released_never_loops_when_the_heap_share_exceeds_capacity():
    # docs/calibration.md: "A hybrid allocator whose heap share exceeds what its prompts can hold at
    # B_max looped forever." 5 mid prompts + 3 very hard, B in [2, 4], B_total 30: surplus 14,
    # 5 of 8 in the heap -> 0.8 x 14 = 11 units, but 5 prompts x (4 - 2) = 10 fit (the released heap
    # stops there too). The 4 left go to the very hard ones, weights .999999, .99, .98 (W = 2.969999):
    # int(4 x .999999 / W) = 1 (3 left), int(3 x .99 / W) = 1 (2 left), int(2 x .98 / W) = 0; the even
    # pass gives the last 2 to the first two: 4, 4, 2.
    p = np.array([0.3, 0.4, 0.5, 0.6, 0.7, 0.0, 0.01, 0.02])
    assert released.allocate_released(p, 30, 2, 4, 5.5, 5.5, 6.0) == [4, 4, 4, 4, 4, 4, 4, 2]
    assert released.allocate_released(p, 32, 2, 4, 5.5, 5.5, 6.0) == [4] * 8  # total = M x B_up: all full
    # all mid-p prompts with a tight B_up: the heap holds everything
    p = np.linspace(0.2, 0.8, 16)
    b = released.allocate_released(p, 16 * 3 + 5, 2, 4, 5.5, 5.5, 6.0)
    assert_feasible(b, 16, 53, 2, 4)


def test_released_caps_binding_drop_no_budget():
    # p = 0, 0, 0 (all very hard), B in [2, 5], B_total 15 = M x B_up, surplus 9. Weighted pass:
    # int(9/3) = 2 in floating point (int(8.99.../3)), int(7/3) = 2, int(5/3) = 1 -> 4, 4, 3; even pass
    # of the last 4: 2, 1, 1 capped at B_up = 5 -> 5, 5, 4 and one unit left. The released code ends
    # there (sum 14 < 15); ours runs the passes again: 5, 5, 5.
    assert released.allocate_released(np.zeros(3), 15, 2, 5, 5.5, 5.5, "adaptive") == [5, 5, 5]
