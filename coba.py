"""Capability-oriented value function of CoBA-RL (arXiv 2602.03048, §2.3, eqs. 1 and 4-9).

How much is one more rollout of prompt x_i worth? CoBA-RL answers with a value V(B_i, p_i) built
from two parts: a Beta-shaped preference over the pass rate p_i whose peak follows the model's
global failure rate (eqs. 4-7, 5), times a saturation factor in the budget B_i (eq. 8). allocate.py
maximises sum_i V(B_i, p_i) under sum_i B_i = B_total (eq. 3, Algorithm 1). This file is the value
side, top to bottom in the paper's order:

    eq. 4   F_t = 1 - (1/M) sum_i p_i            global_failure_rate
    eq. 6   F_tilde = Psi(F_bar)                 transform_failure_rate
    eq. 7   alpha_t, beta_t from F_tilde         beta_params
    eq. 5   Beta(alpha_t, beta_t) pdf in p       preference_density
    eq. 8   eta = 1 - exp(-(B/tau) p (1-p))      saturation
    eq. 9   V = eta * Density                    capability_value, capability_value_coeffs (App. A)
    --      tau of eq. 8 (released code)         adaptive_tau, resolve_tau
    --      schedules of Tables 2-3              Schedule, parse_schedule, schedule_params
    eq. 1   p_i, F_t's history, F_bar            CapabilityTracker (pass_rates, update, f_bar, alpha_beta)

Where the paper is silent or we chose otherwise (eq. 7's bounds, the clip of p, tau, the window k,
the prior, the schedules' formulas, released_init, resuming): docs/method-sources.md §1, its table
and its list "`coba.py` beyond the paper".

Knapsack-RL's value is in arms/knapsack.py, its statistics (recorded beside this tracker) in
arms/knapsack_stats.py, the --probe in arms/probe.py.

Tests: tests/test_coba.py
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np


P_CLIP = (0.01, 0.99)   # released code: keeps every prompt's value > 0 inside eq. 9
PRIOR = 0.5             # released code: pass rate of a never-seen prompt


def _out(x):
    """0-d arrays back to Python floats (JSON-friendly logs); arrays stay arrays."""
    x = np.asarray(x, dtype=float)
    return float(x) if x.ndim == 0 else x


# ----------------------------------------------------------------------------------------------
# Eqs. 4, 6, 7: from the batch's pass rates to the Beta shape parameters alpha_t, beta_t
# ----------------------------------------------------------------------------------------------
def global_failure_rate(pass_rates) -> float:
    """Eq. 4: F_t = 1 - S_t, S_t = (1/M) sum_i p_i.

    pass_rates: p_i of eq. 1, shape (M,). Averaged over prompts, not rollouts: a prompt given 64
    rollouts weighs as much as one given 2 (docs/method-sources.md §0).
    """
    p = np.asarray(pass_rates, dtype=float)  # (M,)
    if p.size == 0:
        raise ValueError("global_failure_rate needs at least one pass rate (M >= 1)")
    return float(1.0 - p.mean())


def transform_failure_rate(f_bar, gamma: float = 10.0):
    """Eq. 6: F_tilde = F_bar if F_bar > 0.5, else sigmoid(gamma * (F_bar - 0.5)).

    F_bar is the mean of the last k F_t (CapabilityTracker.f_bar). The sigmoid branch keeps eq. 6
    continuous at F_bar = 0.5 (sigmoid(0) = 0.5) while squeezing a strong model (low F_bar) towards 0
    fast: 0.3 -> 0.119, 0.2 -> 0.047. Range (sigmoid(-gamma/2), 1].
    """
    F_bar = np.asarray(f_bar, dtype=float)
    F_tilde = np.where(F_bar > 0.5, F_bar, 1.0 / (1.0 + np.exp(-gamma * (F_bar - 0.5))))
    return _out(F_tilde)


def beta_params(f_tilde, kappa: float = 11.0, alpha_min: float = 1.0, alpha_max: float | None = None,
                lam: float | None = None):
    """Eq. 7: alpha_t = clip(alpha_min + lambda * F_tilde, alpha_min, alpha_max), beta_t = kappa - alpha_t.

    Defaults alpha_max = kappa - 1 and lambda = kappa - 2 are the released code's (paper silent), so
    F_tilde in [0, 1] sweeps alpha_t over [1, kappa - 1] and beta_t stays >= 1. A high failure rate
    gives a large alpha_t: the density peaks at high p (easy prompts) -- "exploit -> explore".
    """
    alpha_max = kappa - 1.0 if alpha_max is None else alpha_max
    lam = kappa - 2.0 if lam is None else lam
    alpha_t = np.clip(alpha_min + lam * np.asarray(f_tilde, dtype=float), alpha_min, alpha_max)
    return _out(alpha_t), _out(kappa - alpha_t)


# ----------------------------------------------------------------------------------------------
# Eqs. 5, 8, 9: the value of giving budget B to a prompt with pass rate p
# ----------------------------------------------------------------------------------------------
def preference_density(p, alpha_t: float, beta_t: float):
    """Eq. 5: Density(p) = p^(alpha_t - 1) (1 - p)^(beta_t - 1) / B(alpha_t, beta_t), the Beta pdf.

    Computed in log space with lgamma, since math.gamma(kappa) overflows a float once kappa > 171.
    p: any shape; alpha_t, beta_t: positive scalars. Mode (alpha_t - 1) / (kappa - 2) when both > 1.
    """
    if not (alpha_t > 0 and beta_t > 0):
        raise ValueError(f"Beta shape parameters must be > 0, got alpha_t={alpha_t}, beta_t={beta_t}")
    p = np.asarray(p, dtype=float)
    log_B = math.lgamma(alpha_t) + math.lgamma(beta_t) - math.lgamma(alpha_t + beta_t)  # log Beta function
    with np.errstate(divide="ignore", invalid="ignore"):
        # an exponent of exactly 0 contributes 0, also at p = 0 or 1 (where 0 * log 0 would be nan)
        log_a = np.where(alpha_t == 1.0, 0.0, (alpha_t - 1.0) * np.log(p))
        log_b = np.where(beta_t == 1.0, 0.0, (beta_t - 1.0) * np.log1p(-p))
        return _out(np.exp(log_a + log_b - log_B))


def saturation(budget, p, tau: float):
    """Eq. 8: eta(B, p) = 1 - exp(-(B / tau) * p * (1 - p)).

    0 at B = 0, increasing and concave in B: extra rollouts of a prompt pay off less and less, and
    faster for p near 0.5 (p(1-p) is the variance of one Bernoulli reward). budget, p broadcast.
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau!r}")
    B, p = np.asarray(budget, dtype=float), np.asarray(p, dtype=float)
    return _out(-np.expm1(-(B / tau) * p * (1.0 - p)))  # expm1: exact near B = 0


def capability_value(budget, p, alpha_t: float, beta_t: float, tau: float):
    """Eq. 9: V(B, p) = eta(B, p) * Density(p; alpha_t, beta_t), p clipped to [0.01, 0.99] first.

    The clip (released code) keeps V > 0 for prompts seen at p = 0 or 1, and Density finite when
    alpha_t or beta_t < 1. budget, p broadcast (e.g. budget (B, 1) against p (M,) -> (B, M)).
    """
    p = np.clip(np.asarray(p, dtype=float), *P_CLIP)
    return _out(saturation(budget, p, tau) * preference_density(p, alpha_t, beta_t))


def capability_value_coeffs(p, alpha_t: float, beta_t: float, tau: float):
    """App. A: V(B) = C (1 - e^{-k B}) with C = Density(p), k = p (1 - p) / tau (p clipped as in eq. 9).

    Prop. 2.2 follows: V(B+1) - V(B) = C e^{-kB} (1 - e^{-k}), geometric in B with ratio e^{-k} < 1,
    so V is concave and a greedy (or threshold) allocation is exactly optimal. Returns (C, k), p's shape.
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau!r}")
    p = np.clip(np.asarray(p, dtype=float), *P_CLIP)
    return _out(preference_density(p, alpha_t, beta_t)), _out(p * (1.0 - p) / tau)


# ----------------------------------------------------------------------------------------------
# tau of eq. 8: the paper calls it a temperature and gives no value; the released code adapts it
# ----------------------------------------------------------------------------------------------
TAU_RANGE = (3.0, 12.0)  # released code: adaptive tau lives in [3, 12]
TAU_VAR_MAX = 0.1667    # released code: variance that maps to the top of TAU_RANGE (~1/6)


def adaptive_tau(pass_rates) -> float:
    """tau of eq. 8 from the batch (released code; paper silent):
    tau = 3 + (12 - 3) * clip(Var(clip(p, 0.01, 0.99)) / 0.1667, 0, 1), population variance.

    Identical pass rates give tau = 3 (sharp saturation); a batch split between 0 and 1 gives 12, so
    the budget spreads further before a prompt saturates. pass_rates: shape (M,).
    """
    p = np.clip(np.asarray(pass_rates, dtype=float), *P_CLIP)  # (M,)
    if p.size == 0:
        raise ValueError("adaptive_tau needs at least one pass rate (M >= 1)")
    lo, hi = TAU_RANGE
    return float(lo + (hi - lo) * np.clip(p.var() / TAU_VAR_MAX, 0.0, 1.0))


def resolve_tau(tau_arg, pass_rates) -> float:
    """tau as asked for -> a number: "adaptive" -> adaptive_tau(pass_rates); a positive float as given."""
    if isinstance(tau_arg, str) and tau_arg.strip() == "adaptive":
        return adaptive_tau(pass_rates)
    try:
        tau = float(tau_arg)
    except (TypeError, ValueError):
        tau = float("nan")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be 'adaptive' or a number > 0 (e.g. 6.0), got {tau_arg!r}")
    return tau


# ----------------------------------------------------------------------------------------------
# Schedules of alpha_t / beta_t (the ablation of Tables 2-3)
# ----------------------------------------------------------------------------------------------
SCHEDULE_FORMS = "exploit2explore, explore2exploit, fixed:A,B (A, B > 0, e.g. fixed:10.5,1.5), linear-decay"
LINEAR_DECAY_STAGES = 10  # paper: alpha "10 -> 1" at kappa = 11, i.e. ten integer levels


@dataclass(frozen=True)
class Schedule:
    """One schedule (`--schedule`). kind in {exploit2explore, explore2exploit, fixed, linear-decay};
    alpha, beta only for `fixed`."""
    kind: str = "exploit2explore"
    alpha: float | None = None
    beta: float | None = None

    def __str__(self) -> str:  # the text back, for logs and state_dict()
        return f"fixed:{self.alpha!r},{self.beta!r}" if self.kind == "fixed" else self.kind


def parse_schedule(text: str) -> Schedule:
    """A schedule's text -> Schedule; anything else is a one-line ValueError listing the forms."""
    s = str(text).strip()
    if s in ("exploit2explore", "explore2exploit", "linear-decay"):
        return Schedule(s)
    if s.startswith("fixed:"):
        parts = s[len("fixed:"):].split(",")
        try:
            a, b = (float(x) for x in parts)  # ValueError on "a,b" and on a count other than 2
        except ValueError:
            a = b = float("nan")
        if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0:
            return Schedule("fixed", a, b)
    raise ValueError(f"schedule {text!r} is not one of: {SCHEDULE_FORMS}")


def schedule_params(schedule: Schedule, f_tilde: float, kappa: float = 11.0, progress: float = 0.0,
                    alpha_min: float = 1.0, alpha_max: float | None = None, lam: float | None = None):
    """(alpha_t, beta_t) of one schedule. progress = step / total_steps in [0, 1].

    exploit2explore  eq. 7 as is (paper's default and best, Table 2: 46.78).
    explore2exploit  eq. 7 with F_tilde -> 1 - F_tilde (ours; paper gives no formula): a weak
                     model starts on hard prompts and moves to easy ones as it improves.
    fixed:A,B        (A, B) whatever F_tilde; kappa is ignored (Table 3's pairs sum to 12).
    linear-decay     alpha_t steps down from alpha_max to alpha_min in LINEAR_DECAY_STAGES equal
                     stages of the run (ours; 10, 9, ..., 1 at kappa = 11), blind to F_tilde.
    """
    alpha_max = kappa - 1.0 if alpha_max is None else alpha_max
    if schedule.kind == "exploit2explore":
        return beta_params(f_tilde, kappa, alpha_min, alpha_max, lam)
    if schedule.kind == "explore2exploit":
        return beta_params(1.0 - f_tilde, kappa, alpha_min, alpha_max, lam)
    if schedule.kind == "fixed":
        return float(schedule.alpha), float(schedule.beta)
    if schedule.kind == "linear-decay":
        n = LINEAR_DECAY_STAGES
        stage = min(max(int(math.floor(n * float(progress))), 0), n - 1)  # progress = 1: last stage
        alpha_t = alpha_max - (alpha_max - alpha_min) * stage / (n - 1)
        return float(alpha_t), float(kappa - alpha_t)
    raise ValueError(f"unknown schedule kind {schedule.kind!r}; use parse_schedule ({SCHEDULE_FORMS})")


# ----------------------------------------------------------------------------------------------
# State across steps: per-prompt pass rates (eq. 1) and the history of F_t (eq. 4)
# ----------------------------------------------------------------------------------------------
def validate_kappa(kappa: float) -> float:
    """kappa = alpha_t + beta_t (eq. 7) must exceed 2 so both can stay >= alpha_min = 1."""
    try:
        ok = math.isfinite(float(kappa)) and float(kappa) > 2
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"kappa = alpha_t + beta_t (eq. 7) must be a number > 2 so that both stay >= 1 "
                         f"(paper: 11), got {kappa!r}")
    return float(kappa)


def validate_window(k: int) -> int:
    """k of the moving average of F_t (and of each prompt's visit history) is a count >= 1."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"window k of F_bar's moving average must be an integer >= 1 (1 = no smoothing), got {k!r}")
    return int(k)


@dataclass
class CapabilityTracker:
    """What CoBA-RL remembers between steps (docs/method-sources.md §3), saved with every checkpoint.

    - each prompt (keyed by its dataset index) keeps (successes, totals) of its last `window`
      visits; p_i = sum successes / sum totals (eq. 1). Unseen prompts get `prior`.
    - `history`: F_t of every step (eq. 4); F_bar = mean of the last `window` of them.
    Order in a training step: pass_rates() + alpha_beta() -> allocate -> rollouts -> update().
    """
    window: int = 1
    prior: float = PRIOR
    gamma: float = 10.0
    kappa: float = 11.0
    schedule: Schedule = field(default_factory=Schedule)
    released_init: bool = False  # (kappa - 2, 2) before the first update (released code)
    history: list = field(default_factory=list)   # F_t per step, oldest first
    visits: dict = field(default_factory=dict, repr=False)  # prompt id -> deque of (successes, totals)

    def __post_init__(self):
        self.window = validate_window(self.window)
        self.kappa = validate_kappa(self.kappa)
        if not 0.0 <= self.prior <= 1.0:
            raise ValueError(f"prior (the pass rate of an unseen prompt) must be in [0, 1], got {self.prior!r}")
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma (steepness of eq. 6's sigmoid; paper 10) must be > 0, got {self.gamma!r}")
        if isinstance(self.schedule, str):
            self.schedule = parse_schedule(self.schedule)
        self.visits = {int(i): deque((tuple(v) for v in hist), maxlen=self.window) for i, hist in self.visits.items()}

    # --- per-prompt pass rates (eq. 1) ---------------------------------------------------------
    def seen(self, prompt_ids: Iterable[int]) -> np.ndarray:
        """(M,) bool: has prompt i been rolled out before (so its p_i is an estimate, not the prior)?"""
        return np.array([int(i) in self.visits for i in prompt_ids], dtype=bool)

    def pass_rates(self, prompt_ids: Iterable[int]) -> np.ndarray:
        """(M,) p_i from the last `window` visits of each prompt; `prior` for never-seen ones."""
        rates = []
        for i in prompt_ids:
            hist = self.visits.get(int(i))
            rates.append(sum(s for s, _ in hist) / sum(n for _, n in hist) if hist else self.prior)
        return np.array(rates, dtype=float)

    def update(self, prompt_ids, successes, totals) -> float:
        """Record one step: prompt i got successes[i] correct out of totals[i] rollouts (B_i).
        Appends F_t = mean over prompts of the failed share (eq. 4) and returns it."""
        ids = [int(i) for i in prompt_ids]
        s, n = np.asarray(successes, dtype=float), np.asarray(totals, dtype=float)  # (M,), (M,)
        if not (len(ids) == s.size == n.size and s.ndim == n.ndim == 1 and len(ids) > 0):
            raise ValueError(f"update needs M >= 1 prompt ids, successes and totals of equal length, "
                             f"got {len(ids)}, {s.size}, {n.size}")
        if not (np.all(np.isfinite(s)) and np.all(n >= 1) and np.all(s >= 0) and np.all(s <= n)):
            raise ValueError("update needs totals >= 1 and 0 <= successes <= totals for every prompt")
        for i, si, ni in zip(ids, s.tolist(), n.tolist()):
            # a deque with maxlen drops the oldest visit once the window is full
            self.visits.setdefault(i, deque(maxlen=self.window)).append((si, ni))
        F_t = global_failure_rate(s / n)  # share of each prompt's rollouts that succeeded, then mean
        self.history.append(F_t)
        return F_t

    # --- F_bar and (alpha_t, beta_t) (eqs. 6-7) ------------------------------------------------
    @property
    def f_bar(self) -> float:
        """Mean of the last `window` F_t; before any step, 1 - prior (ours: no evidence either way)."""
        if not self.history:
            return 1.0 - self.prior
        return float(np.mean(self.history[-self.window:]))

    def alpha_beta(self, progress: float = 0.0) -> tuple[float, float]:
        """(alpha_t, beta_t) for the next allocation: eq. 6 on F_bar, then the schedule (eq. 7).
        released_init: (kappa - 2, 2) before the first update, with the paper's schedule (released code)."""
        if self.released_init and not self.history and self.schedule.kind == "exploit2explore":
            return self.kappa - 2.0, 2.0
        F_tilde = transform_failure_rate(self.f_bar, self.gamma)
        return schedule_params(self.schedule, F_tilde, self.kappa, progress)

    # --- checkpoints ---------------------------------------------------------------------------
    def config(self) -> dict:
        return {"window": self.window, "prior": self.prior, "gamma": self.gamma, "kappa": self.kappa,
                "schedule": str(self.schedule), "released_init": bool(self.released_init)}

    def state_dict(self) -> dict:
        """JSON-serialisable: plain floats/lists; prompt ids become str keys (JSON objects need them)."""
        return {**self.config(), "history": [float(F) for F in self.history],
                "visits": {str(i): [[float(s), float(n)] for s, n in hist] for i, hist in self.visits.items()}}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Restore from state_dict(). strict: the saved settings must equal this tracker's (a resumed run
        with another kappa would silently log a different method); strict=False keeps ours."""
        # checkpoints from before released_init lack it: they ran with the default, False
        saved = {k: state.get(k, False) if k == "released_init" else state[k] for k in self.config()}
        if strict and saved != self.config():
            diff = ", ".join(f"{k}={saved[k]!r} (now {v!r})" for k, v in self.config().items() if saved[k] != v)
            raise ValueError(f"tracker checkpoint was saved with {diff}; resume with the same settings or strict=False")
        self.history = [float(F) for F in state["history"]]
        self.visits = {int(i): deque(((float(s), float(n)) for s, n in hist), maxlen=self.window)
                       for i, hist in state["visits"].items()}
