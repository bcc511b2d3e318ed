"""Tests of coba.py: the capability-oriented value function (paper §2.3, eqs. 4-9), its schedules
and the pass-rate tracker (with the Knapsack-RL statistics it keeps); beside them Knapsack-RL's value
(arms/knapsack.py). Numbers in the asserts can be redone by hand.

Run: cd /work/main && python -m pytest -q tests/test_coba.py   (~1 s, no model needed)
"""
import json
import math

import numpy as np
import pytest

import coba
from arms.knapsack import knapsack_value
from arms.knapsack_stats import WithKnapsackStats

KAPPA = 11.0
P = np.linspace(0.0, 1.0, 200_001)  # quadrature / argmax grid on [0, 1], step 5e-6


def integral(y, x=P):
    """Trapezoid rule, written out (np.trapezoid needs numpy >= 2; requirements allow 1.26)."""
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)))


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------------------------
# Eqs. 4, 6, 7
# ----------------------------------------------------------------------------------------------
def test_global_failure_rate_is_one_minus_mean_pass_rate():
    # eq. 4: S = (0.2 + 0.6 + 1.0) / 3 = 0.6, F = 0.4
    assert coba.global_failure_rate([0.2, 0.6, 1.0]) == pytest.approx(0.4, abs=1e-9)  # a float64 mean of decimals vs the hand value: rounding only


def test_transform_failure_rate_paper_examples():
    # eq. 6, low branch: sigmoid(10 * (0.3 - 0.5)) = sigmoid(-2) = 1 / (1 + e^2) = 0.1192
    assert coba.transform_failure_rate(0.3) == pytest.approx(0.119, abs=5e-4)
    # sigmoid(-3) = 1 / (1 + e^3) = 0.0474
    assert coba.transform_failure_rate(0.2) == pytest.approx(0.047, abs=5e-4)
    # high branch is the identity, right from above 0.5 (a sigmoid would give sigmoid(0.5) = 0.622 at 0.55)
    assert coba.transform_failure_rate(0.8) == 0.8  # exact: the identity branch returns its input
    assert coba.transform_failure_rate(0.55) == 0.55  # exact: the identity branch returns its input
    # vectorised, and gamma is used: gamma = 5 at 0.3 -> sigmoid(-1) = 0.2689
    np.testing.assert_allclose(coba.transform_failure_rate(np.array([0.3, 0.8]), gamma=5.0),
                               [sigmoid(-1.0), 0.8], rtol=1e-12)


def test_transform_failure_rate_continuous_at_half():
    # sigmoid(0) = 0.5 = the identity branch at 0.5: no jump where the branches meet
    eps = 1e-9
    assert coba.transform_failure_rate(0.5) == 0.5  # exact: sigmoid(0) = 1 / (1 + e^0) = 0.5, no rounding
    assert coba.transform_failure_rate(0.5 - eps) == pytest.approx(0.5, abs=1e-8)
    assert coba.transform_failure_rate(0.5 + eps) == pytest.approx(0.5, abs=1e-8)


def test_beta_params_released_defaults():
    # alpha = clip(1 + 9 F_tilde, 1, 10), beta = 11 - alpha
    assert coba.beta_params(0.0) == (1.0, 10.0)  # exact: dyadic: 1 + 9 F with no rounding
    assert coba.beta_params(1.0) == (10.0, 1.0)  # exact: dyadic: 1 + 9 F with no rounding
    assert coba.beta_params(0.5) == (5.5, 5.5)  # exact: dyadic: 1 + 9 F with no rounding
    # explicit parameters override the released defaults: clip(2 + 20 * 0.5, 2, 8) = 8
    assert coba.beta_params(0.5, kappa=11.0, alpha_min=2.0, alpha_max=8.0, lam=20.0) == (8.0, 3.0)  # exact: dyadic: clip(2 + 20 x 0.5) with no rounding


@pytest.mark.parametrize("alpha, beta", [(7.26, 3.74), (4.50, 6.50), (2.54, 8.46)])
def test_figure4_pairs_come_from_eq7(alpha, beta):
    # Figure 4's labels sum to kappa = 11 and invert eq. 7 to an F_tilde in [0, 1]:
    # F_tilde = (alpha - 1) / 9 -> 0.696, 0.389, 0.171
    assert alpha + beta == pytest.approx(KAPPA, abs=1e-9)  # decimal literals' float64 rounding
    F_tilde = (alpha - 1.0) / (KAPPA - 2.0)
    assert 0.0 <= F_tilde <= 1.0
    a, b = coba.beta_params(F_tilde, KAPPA)
    assert (a, b) == pytest.approx((alpha, beta), abs=1e-9)  # (alpha - 1) / 9 and back: float64 rounding
    # and some F_bar in [0, 1] reaches that F_tilde through eq. 6 (invert the branch it lies on)
    F_bar = F_tilde if F_tilde > 0.5 else 0.5 + math.log(F_tilde / (1 - F_tilde)) / 10.0
    assert 0.0 <= F_bar <= 1.0
    assert coba.transform_failure_rate(F_bar) == pytest.approx(F_tilde, abs=1e-9)  # a log and an exp round trip: libm rounding


# ----------------------------------------------------------------------------------------------
# Schedules (Table 2-3 ablation)
# ----------------------------------------------------------------------------------------------
def test_parse_schedule_accepted_forms():
    assert coba.parse_schedule("exploit2explore") == coba.Schedule("exploit2explore")
    assert coba.parse_schedule("explore2exploit").kind == "explore2exploit"
    assert coba.parse_schedule("linear-decay").kind == "linear-decay"
    s = coba.parse_schedule("fixed:10.5,1.5")
    assert (s.kind, s.alpha, s.beta) == ("fixed", 10.5, 1.5)  # exact: parsed from the text: copies
    assert coba.parse_schedule(str(s)) == s  # the text round-trips (used by state_dict)


def test_schedule_params_each_kind():
    F_tilde = 0.8
    # exploit2explore: alpha = 1 + 9 * 0.8 = 8.2
    assert coba.schedule_params(coba.Schedule("exploit2explore"), F_tilde, KAPPA) == pytest.approx((8.2, 2.8))
    # explore2exploit (our reading): alpha = 1 + 9 * (1 - 0.8) = 2.8
    assert coba.schedule_params(coba.Schedule("explore2exploit"), F_tilde, KAPPA) == pytest.approx((2.8, 8.2))
    # fixed: as given, kappa ignored (Table 3: 10.5 + 1.5 = 12, not 11)
    assert coba.schedule_params(coba.parse_schedule("fixed:1.5,10.5"), F_tilde, KAPPA) == (1.5, 10.5)  # exact: fixed: the pair given, copied


def test_linear_decay_steps_10_to_1_at_kappa_11():
    sched = coba.parse_schedule("linear-decay")
    # 10 equal stages of the run: stage = floor(10 * progress), alpha = 10 - stage
    alphas = [coba.schedule_params(sched, 0.3, KAPPA, progress=k / 100)[0] for k in range(101)]
    assert alphas[0] == 10.0 and alphas[9] == 10.0 and alphas[10] == 9.0  # exact: integer-valued: 10 - stage
    assert alphas[95] == 1.0 and alphas[100] == 1.0  # exact: integer-valued: 10 - stage
    assert sorted(set(alphas)) == [float(a) for a in range(1, 11)]  # exact: integer-valued: 10 - stage
    assert all(a >= b for a, b in zip(alphas, alphas[1:]))  # never goes back up
    # blind to F_tilde, and beta = kappa - alpha: progress 0.55 -> stage 5 -> alpha 5, beta 6
    assert coba.schedule_params(sched, 0.9, KAPPA, progress=0.55) == (5.0, 6.0)  # exact: integer-valued: 10 - 9 x 5 / 9
    # other kappa: from kappa - 1 = 6 down to 1 in 9 equal steps of 5/9
    assert coba.schedule_params(sched, 0.3, 7.0, progress=0.0) == (6.0, 1.0)  # exact: integer-valued: kappa - 1 at stage 0
    assert coba.schedule_params(sched, 0.3, 7.0, progress=0.99) == pytest.approx((1.0, 6.0))


# ----------------------------------------------------------------------------------------------
# Eq. 5: preference density
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha, beta", [(2.0, 2.0), (7.26, 3.74), (4.5, 6.5), (2.54, 8.46), (1.0, 10.0)])
def test_density_integrates_to_one(alpha, beta):
    assert integral(coba.preference_density(P, alpha, beta)) == pytest.approx(1.0, abs=1e-6)


def test_density_closed_forms():
    p = np.array([0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
    # Beta(2, 2): 1 / B(2, 2) = Gamma(4) / (Gamma(2) Gamma(2)) = 6 -> 6 p (1 - p)
    np.testing.assert_allclose(coba.preference_density(p, 2.0, 2.0), 6 * p * (1 - p), rtol=1e-12, atol=1e-15)
    # Beta(1, 1) is uniform: 1 everywhere, also at the end points (0^0 handled)
    np.testing.assert_allclose(coba.preference_density(p, 1.0, 1.0), np.ones_like(p), rtol=1e-12)
    # Beta(1, 10) = 10 (1 - p)^9: the alpha_t = alpha_min end of eq. 7 at kappa = 11
    np.testing.assert_allclose(coba.preference_density(p, 1.0, 10.0), 10 * (1 - p) ** 9, rtol=1e-12, atol=1e-15)
    # Beta(3, 2): Gamma(5) / (Gamma(3) Gamma(2)) = 24 / 2 = 12 -> 12 p^2 (1 - p); at 0.5: 12 / 8 = 1.5
    assert coba.preference_density(0.5, 3.0, 2.0) == pytest.approx(1.5, rel=1e-12)


def test_density_no_overflow_at_large_kappa():
    # math.gamma(200) overflows (the float limit is near Gamma(171.6)); lgamma does not
    with pytest.raises(OverflowError):
        math.gamma(200.0)
    d = coba.preference_density(P, 100.0, 100.0)
    assert np.all(np.isfinite(d))
    assert integral(d) == pytest.approx(1.0, abs=1e-6)
    # peak at 0.5 ~ normal approximation 1 / sqrt(2 pi var), var = 1 / (4 * 201)
    assert d[len(P) // 2] == pytest.approx(1 / math.sqrt(2 * math.pi / (4 * 201)), rel=0.01)


# ----------------------------------------------------------------------------------------------
# Eq. 8: saturation; eq. 9 and App. A: value and marginal gain
# ----------------------------------------------------------------------------------------------
def test_saturation_by_hand_and_shape():
    # B = 4, p = 0.5, tau = 1: 1 - exp(-4 * 0.25 / 1) = 1 - e^-1 = 0.632121
    assert coba.saturation(4, 0.5, 1.0) == pytest.approx(1 - math.exp(-1), rel=1e-12)
    B = np.arange(0, 65)
    eta = coba.saturation(B, 0.3, 6.0)  # (65,)
    assert eta[0] == 0.0  # exact: B = 0: -expm1(-0) = 0, no rounding
    assert np.all(np.diff(eta) > 0)         # increasing in B
    assert np.all(np.diff(eta, 2) < 0)      # concave in B
    # broadcasting: budgets (3, 1) x pass rates (4,) -> (3, 4)
    assert coba.saturation(np.array([[1], [2], [3]]), np.array([0.1, 0.2, 0.3, 0.4]), 6.0).shape == (3, 4)


def test_capability_value_is_saturation_times_density_with_clipped_p():
    a, b, tau = 4.5, 6.5, 6.0
    # p = 0.3, B = 8: (1 - exp(-8 * 0.21 / 6)) * Beta(4.5, 6.5) pdf at 0.3
    expect = (1 - math.exp(-8 * 0.21 / 6)) * coba.preference_density(0.3, a, b)
    assert coba.capability_value(8, 0.3, a, b, tau) == pytest.approx(expect, rel=1e-12)
    # p = 0 and 1 are valued as 0.01 and 0.99 (released code): > 0, not exactly 0
    v0, v1 = coba.capability_value(8, np.array([0.0, 1.0]), a, b, tau)
    assert v0 == pytest.approx(coba.capability_value(8, 0.01, a, b, tau), rel=1e-12) and v0 > 0
    assert v1 == pytest.approx(coba.capability_value(8, 0.99, a, b, tau), rel=1e-12) and v1 > 0


def test_marginal_gain_matches_prop_2_2_and_decreases():
    a, b, tau = 7.26, 3.74, 6.0
    p = np.array([0.0, 0.1, 0.5, 0.8, 1.0])  # (5,)
    C, k = coba.capability_value_coeffs(p, a, b, tau)
    B = np.arange(0, 129)[:, None]  # (129, 1)
    V = coba.capability_value(B, p, a, b, tau)  # (129, 5)
    np.testing.assert_allclose(V, C * (1 - np.exp(-k * B)), rtol=1e-12, atol=1e-15)
    gain = V[1:] - V[:-1]  # (128, 5): V(B + 1) - V(B)
    np.testing.assert_allclose(gain, C * np.exp(-k * B[:-1]) * (1 - np.exp(-k)), rtol=1e-9, atol=1e-15)
    assert np.all(np.diff(gain, axis=0) < 0)  # strictly decreasing: the greedy is exact


def argmax_p(schedule: str, F_bar: float, budget=16, tau=6.0) -> float:
    alpha_t, beta_t = coba.schedule_params(coba.parse_schedule(schedule), coba.transform_failure_rate(F_bar), KAPPA)
    return float(P[np.argmax(coba.capability_value(budget, P, alpha_t, beta_t, tau))])


def test_value_peaks_at_easier_prompts_when_failure_rate_is_high():
    # paper §2.3: exploit -> explore. F_bar = 0.8: alpha = 8.2, Density mode 7.2 / 9 = 0.8 (easy);
    # F_bar = 0.2: F_tilde = 0.047, alpha = 1.43, mode 0.047 (hard). V keeps that order.
    high, low = argmax_p("exploit2explore", 0.8), argmax_p("exploit2explore", 0.2)
    assert high > 0.6 and low < 0.3, (high, low)
    # the mirrored schedule reverses it
    high, low = argmax_p("explore2exploit", 0.8), argmax_p("explore2exploit", 0.2)
    assert high < 0.4 and low > 0.7, (high, low)


def test_adaptive_tau():
    assert coba.adaptive_tau([0.4, 0.4, 0.4]) == 3.0            # exact: Var ~1e-33 vanishes against 3 in float64; Var = 0
    assert coba.adaptive_tau([0.0, 1.0, 0.0, 1.0]) == 12.0      # exact: clipped at 1: 3 + 9 x 1; clip -> 0.01/0.99, Var = 0.49^2 > 0.1667
    # p = (0.3, 0.7): Var = 0.04 -> 3 + 9 * 0.04 / 0.1667 = 5.1596
    assert coba.adaptive_tau([0.3, 0.7]) == pytest.approx(3 + 9 * 0.04 / 0.1667, rel=1e-12)


def test_resolve_tau():
    assert coba.resolve_tau("adaptive", [0.3, 0.7]) == pytest.approx(coba.adaptive_tau([0.3, 0.7]))
    assert coba.resolve_tau("6.0", [0.3, 0.7]) == 6.0  # exact: parsed or passed through: copies
    assert coba.resolve_tau(2.5, [0.3]) == 2.5  # exact: parsed or passed through: copies


# ----------------------------------------------------------------------------------------------
# Knapsack-RL's value (arms/knapsack.py)
# ----------------------------------------------------------------------------------------------
def test_knapsack_value():
    N = np.arange(0, 33)[:, None]  # (33, 1)
    # exact: 1 - 0**N - 1**N is 0 with no rounding at p in {0, 1}
    np.testing.assert_array_equal(knapsack_value(N, np.array([0.0, 1.0])), 0.0)  # p in {0, 1}
    assert np.all(knapsack_value(N, 0.3) >= 0)  # N = 0 clipped to 0, not -p (1-p)^2
    # by hand: N = 2, p = 0.5: (1 - 0.25 - 0.25) * 0.5 * 0.25 = 0.0625
    assert knapsack_value(2, 0.5) == pytest.approx(0.0625, rel=1e-12)
    # information term p (1 - p)^2 peaks at 1/3 (d/dp = (1 - p)(1 - 3p) = 0); at large N the first factor ~ 1
    assert P[np.argmax(knapsack_value(10_000, P))] == pytest.approx(1 / 3, abs=1e-4)
    # its marginal gain also shrinks in N (so the same heap is optimal for it)
    gain = np.diff(knapsack_value(np.arange(1, 65), 0.2))
    assert np.all(np.diff(gain) < 0)


# ----------------------------------------------------------------------------------------------
# CapabilityTracker (docs/method-sources.md §3)
# ----------------------------------------------------------------------------------------------
def test_tracker_unseen_prompts_get_prior():
    tr = coba.CapabilityTracker(prior=0.5)
    assert tr.pass_rates([3, 7]).tolist() == [0.5, 0.5]  # exact: the prior, copied
    assert tr.seen([3, 7]).tolist() == [False, False]
    assert tr.f_bar == 0.5  # exact: 1 - 0.5, no rounding; no F_t yet: 1 - prior
    assert tr.alpha_beta() == (5.5, 5.5)  # exact: dyadic, no rounding; F_tilde = 0.5 -> alpha = 1 + 9 * 0.5
    # another prior: unseen prompts get it, and F_bar = 1 - 0.3 = 0.7 (identity branch) -> alpha = 7.3
    tr = coba.CapabilityTracker(prior=0.3)
    assert tr.pass_rates([3]).tolist() == [0.3] and tr.f_bar == pytest.approx(0.7)  # exact: the prior, copied
    assert tr.alpha_beta() == pytest.approx((7.3, 3.7))


def test_tracker_update_sets_pass_rates():
    tr = coba.CapabilityTracker()
    tr.update([3, 7], successes=[3, 0], totals=[4, 2])
    assert tr.pass_rates([7, 3, 11]).tolist() == [0.0, 0.75, 0.5]  # exact: k / n with n a power of 2 (or the prior): dyadic; 0/2, 3/4, unseen -> prior
    assert tr.seen([7, 3, 11]).tolist() == [True, True, False]


def test_tracker_window_drops_older_visits():
    tr = coba.CapabilityTracker(window=2)
    tr.update([5], [1], [4])   # F = 3/4
    tr.update([5], [3], [4])   # F = 1/4
    assert tr.pass_rates([5])[0] == (1 + 3) / (4 + 4)   # exact: dyadic, no rounding; pooled over both visits: 0.5
    tr.update([5], [4], [4])   # F = 0; the first visit falls out
    assert tr.pass_rates([5])[0] == (3 + 4) / (4 + 4)   # exact: dyadic, no rounding; 0.875
    assert tr.history == [0.75, 0.25, 0.0]  # exact: dyadic, no rounding
    assert tr.f_bar == (0.25 + 0.0) / 2                 # exact: dyadic, no rounding; last 2 F_t only
    # window 1 (released launch script): only the latest visit and the latest F_t count
    tr1 = coba.CapabilityTracker(window=1)
    tr1.update([5], [1], [4])
    tr1.update([5], [3], [4])
    assert tr1.pass_rates([5])[0] == 0.75 and tr1.f_bar == 0.25  # exact: dyadic, no rounding


def test_tracker_failure_rate_is_averaged_over_prompts_not_rollouts():
    tr = coba.CapabilityTracker()
    # prompt 0: 1 of 2 correct (fails 1/2); prompt 1: 0 of 8 correct (fails 8/8)
    F_t = tr.update([0, 1], successes=[1, 0], totals=[2, 8])
    assert F_t == (0.5 + 1.0) / 2 == 0.75      # exact: dyadic, no rounding; eq. 4, mean over prompts
    assert F_t != pytest.approx(9 / 10)                        # the rollout average would give 0.9
    assert tr.history == [0.75]  # exact: dyadic, no rounding


def test_tracker_state_dict_round_trip_through_json():
    tr = coba.CapabilityTracker(window=3, schedule=coba.parse_schedule("explore2exploit"))
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids = rng.choice(40, size=8, replace=False).tolist()
        totals = rng.integers(2, 17, size=8)
        tr.update(ids, rng.binomial(totals, 0.4).astype(float).tolist(), totals.tolist())
    state = json.loads(json.dumps(tr.state_dict()))
    tr2 = coba.CapabilityTracker(window=3, schedule=coba.parse_schedule("explore2exploit"))
    tr2.load_state_dict(state)
    ids = list(range(40))
    assert all(isinstance(i, int) for i in tr2.visits)  # ids come back as ints, not "12"
    assert tr2.pass_rates(ids).tolist() == tr.pass_rates(ids).tolist()
    assert tr2.seen(ids).tolist() == tr.seen(ids).tolist()
    assert tr2.f_bar == tr.f_bar and tr2.history == tr.history
    assert tr2.alpha_beta(0.3) == tr.alpha_beta(0.3)
    # the window keeps bounding the restored history
    tr2.update([ids[0]] * 4, [1, 1, 1, 1], [2, 2, 2, 2])
    assert len(tr2.visits[ids[0]]) == 3
    # resuming with other flags is refused unless asked for
    other = coba.CapabilityTracker(window=3, kappa=7.0, schedule=coba.parse_schedule("explore2exploit"))
    with pytest.raises(ValueError, match="kappa"):
        other.load_state_dict(state)
    other.load_state_dict(state, strict=False)  # keeps kappa = 7, takes the data
    assert other.kappa == 7.0 and other.history == tr.history  # exact: copies


def with_stats(**kw) -> WithKnapsackStats:
    """The run's tracker: coba's, with Knapsack-RL's statistics recorded beside it."""
    return WithKnapsackStats(coba.CapabilityTracker(**kw))


def test_tracker_knapsack_stats_follow_knapsack_rl():
    # liziniu/KnapsackRL rl_dataset.py update_sample_state: p_hat = the visit's mean if it had >= 16
    # rollouts, else the mean of the last 16 rewards over visits; count = rollouts ever recorded
    # (valid for the allocator from 8). Unseen: (0.0, 0).
    tr = with_stats(window=1)
    first = [1, 1, 1, 1] + [0] * 12                   # 16 rollouts, 4 correct: p_hat = 4/16
    tr.update([9], [4], [16], rewards=[first])
    assert [x.tolist() for x in tr.knapsack.stats([9, 5])] == [[0.25, 0.0], [16, 0]]  # exact: dyadic p_hat, integer counts
    tr.update([9], [8], [8], rewards=[[1] * 8])       # 8 < 16: the last 16 rewards = 8 zeros + 8 ones
    assert [x.tolist() for x in tr.knapsack.stats([9])] == [[0.5], [24]]  # exact: dyadic p_hat, integer counts
    assert tr.pass_rates([9])[0] == 1.0               # exact: 8 / 8; CoBA's own p_i keeps its window (1 visit)
    # without the order of the rewards, each rollout of a visit counts s/n (ours):
    # the last 16 = 8 of the first visit at .25 + 8 ones -> (2 + 8) / 16 = .625
    tr2 = with_stats(window=1)
    tr2.update([9], [4], [16])
    tr2.update([9], [8], [8])
    assert tr2.knapsack.stats([9])[0].tolist() == [0.625]  # exact: 10 / 16: dyadic
    with pytest.raises(ValueError, match="rewards"):
        tr2.update([9], [1], [2], rewards=[[1, 1]])   # sums to 2, not successes = 1


def test_tracker_released_init_before_the_first_update():
    # released BetaAllocator.__init__: (alpha, beta) = (kappa - 2, 2) until the first update; ours
    # otherwise: F_bar = 1 - prior = .5 -> (5.5, 5.5) at kappa 11
    assert coba.CapabilityTracker().alpha_beta() == (5.5, 5.5)  # exact: dyadic, no rounding
    tr = coba.CapabilityTracker(released_init=True)
    assert tr.alpha_beta() == (9.0, 2.0)  # exact: kappa - 2 and 2: integers
    tr.update([0, 1], [1, 1], [2, 2])                  # F_t = .5 -> eq. 7 from now on
    assert tr.alpha_beta() == (5.5, 5.5)  # exact: dyadic, no rounding
    assert coba.CapabilityTracker(released_init=True, schedule="fixed:2,3").alpha_beta() == (2.0, 3.0)  # exact: fixed: the pair given, copied


def test_tracker_round_trips_knapsack_stats_and_loads_older_checkpoints():
    tr = with_stats(window=2, released_init=True)
    tr.update([1, 2], [3, 0], [4, 16], rewards=[[1, 0, 1, 1], [0] * 16])
    tr.update([1], [2], [8])
    state = json.loads(json.dumps(tr.state_dict()))
    tr2 = with_stats(window=2, released_init=True)
    tr2.load_state_dict(state)
    assert [x.tolist() for x in tr2.knapsack.stats([1, 2])] == [x.tolist() for x in tr.knapsack.stats([1, 2])]
    with pytest.raises(ValueError, match="released_init"):
        coba.CapabilityTracker(window=2).load_state_dict(state)
    # a checkpoint from before released_init and the knapsack statistics: released_init = False, and
    # the statistics are rebuilt from the visits kept: prompt 1's two visits, 3/4 then 2/8, each
    # rollout at its visit's mean -> 12 rollouts, last 16 = all: (3 + 2) / 12
    old = {k: v for k, v in state.items() if k not in ("released_init", "knapsack")}
    tr3 = with_stats(window=2)
    tr3.load_state_dict(old)
    p_hat, n = tr3.knapsack.stats([1, 2])
    assert n.tolist() == [12, 16] and p_hat.tolist() == pytest.approx([5 / 12, 0.0], abs=1e-15)  # exact: dyadic sums, then the one division 5 / 12


# ----------------------------------------------------------------------------------------------
# Bad input: one-line ValueErrors that name the accepted forms
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, names", [
    (lambda: coba.parse_schedule("cosine"), "fixed:A,B"),
    (lambda: coba.parse_schedule("fixed:1"), "fixed:A,B"),
    (lambda: coba.parse_schedule("fixed:a,b"), "fixed:A,B"),
    (lambda: coba.parse_schedule("fixed:0,11"), "fixed:A,B"),
    (lambda: coba.parse_schedule("fixed:1,2,3"), "fixed:A,B"),
    (lambda: coba.validate_kappa(2), "> 2"),
    (lambda: with_stats(kappa=2.0), "> 2"),
    (lambda: coba.validate_window(0), ">= 1"),
    (lambda: with_stats(window=0), ">= 1"),
    (lambda: coba.resolve_tau(0, [0.5]), "adaptive"),
    (lambda: coba.resolve_tau(-1, [0.5]), "adaptive"),
    (lambda: coba.resolve_tau("abc", [0.5]), "adaptive"),
    (lambda: coba.resolve_tau("nan", [0.5]), "adaptive"),
    (lambda: with_stats(prior=1.5), "[0, 1]"),
    (lambda: with_stats().update([1, 2], [1], [2, 2]), "equal length"),
    (lambda: with_stats().update([1], [3], [2]), "successes <= totals"),
    (lambda: coba.saturation(1, 0.5, 0.0), "tau"),
])
def test_bad_input_is_one_line_value_error(call, names):
    with pytest.raises(ValueError) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg and names in msg, msg


# ----------------------------------------------------------------------------------------------
# Gaps found by mutation testing (results/mutation.md): each test kills one surviving mutant
# ----------------------------------------------------------------------------------------------
def test_adaptive_tau_single_prompt_and_empty_batch():
    assert coba.adaptive_tau([0.3]) == 3.0  # exact: one value: variance 0, 3 + 0; one pass rate: variance 0 -> the bottom of [3, 12]
    with pytest.raises(ValueError, match="at least one"):
        coba.adaptive_tau([])


def test_tracker_refuses_gamma_zero():
    with pytest.raises(ValueError, match="gamma"):
        coba.CapabilityTracker(gamma=0.0)


def test_tracker_rebuilt_from_visits_keeps_the_window():
    """A tracker built from saved visits still drops the oldest visit once `window` is full."""
    t = coba.CapabilityTracker(window=2, visits={0: [(1.0, 2.0), (0.0, 2.0)]})
    t.update([0], [2.0], [2.0])
    assert list(t.visits[0]) == [(0.0, 2.0), (2.0, 2.0)]  # exact: the visits given, copied
    assert t.pass_rates([0])[0] == pytest.approx(0.5)


def test_load_state_dict_compares_the_schedule():
    saved = coba.CapabilityTracker(schedule="exploit2explore").state_dict()
    with pytest.raises(ValueError, match="schedule"):
        coba.CapabilityTracker(schedule="explore2exploit").load_state_dict(saved)


def test_knapsack_statistics_survive_a_checkpoint():
    t = with_stats()
    t.update([3, 7], [1.0, 0.0], [4.0, 2.0], rewards=[[0, 1, 0, 0], [0, 0]])
    t.update([3], [2.0], [2.0], rewards=[[1, 1]])
    back = with_stats()
    back.load_state_dict(json.loads(json.dumps(t.state_dict())))
    for got, want in zip(back.knapsack.stats([3, 7, 9]), t.knapsack.stats([3, 7, 9])):
        # exact: the same statistics before and after a JSON round trip
        np.testing.assert_array_equal(got, want)
    p_hat, counts = back.knapsack.stats([3, 7])
    assert counts.tolist() == [6, 2] and p_hat[0] == pytest.approx(3 / 6)  # last 16 rewards: 0,1,0,0,1,1


def test_the_runs_tracker_copies_and_pickles_with_its_statistics():
    """WithKnapsackStats passes every other name to the tracker it wraps; a copy or an unpickled one
    (torchrun's broadcasts pickle) must not ask its tracker before it has one."""
    import copy
    import pickle

    t = with_stats(window=2)
    t.update([3, 7], [1.0, 0.0], [4.0, 2.0], rewards=[[0, 1, 0, 0], [0, 0]])
    for back in (copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert back.state_dict() == t.state_dict() and back.pass_rates([3, 7]).tolist() == [0.25, 0.0]  # exact: a copy; 1/4 and 0/2 are dyadic
