"""The in-step probe (ours, beyond the paper: --probe): the tracker's pass rates with this step's probe.

The paper's allocator only knows a prompt's pass rate from an earlier visit (docs/method-sources.md
§3): the first pass over the pool is uniform, and a prompt last seen at p = 0 keeps B_low and rarely
escapes ("sticky zero", docs/calibration.md). With --probe every prompt first gets B_low rollouts in
the step (arms/steps.py: Probe); the allocator then sees p_i pooled over those and the
earlier visits, and hands out the rest of the same B_total. Costs one extra generation round per
step, no extra rollouts. `tracker` is a coba.CapabilityTracker.

Tests: tests/test_arms.py, tests/test_step.py (a step with --probe).
"""
from __future__ import annotations

import numpy as np


def probe_pass_rates(tracker, prompt_idx, probe_successes, probe_budget: int) -> np.ndarray:
    """(M,) p_i = (successes of the last visits + probe successes) / (their rollouts + B_low).

    Pooling (our choice) keeps the estimate from resting on B_low = 2 samples alone; the last
    visits are the tracker's window (--failure-window), the probe rows come from this step."""
    rates = []
    for i, s in zip(prompt_idx, probe_successes):
        hist = tracker.visits.get(int(i), ())
        rates.append((sum(h[0] for h in hist) + float(s)) / (sum(h[1] for h in hist) + probe_budget))
    return np.array(rates, dtype=float)


def probe_knapsack_stats(tracker, prompt_idx, probe_rewards: list[float], probe_budget: int):
    """Knapsack-RL's (p_hat, rollouts recorded) as if the probe were already recorded: the tracker's
    own rule (arms/knapsack_stats.py KnapsackStats.after) with each prompt's B_low probe rewards."""
    after = [tracker.knapsack.after(i, probe_rewards[k * probe_budget:(k + 1) * probe_budget])
             for k, i in enumerate(prompt_idx)]
    return np.array([a[1] for a in after], dtype=float), np.array([a[0] for a in after], dtype=int)
