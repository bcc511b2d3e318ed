"""Knapsack-RL's p estimate (Li et al., arXiv 2509.25849; liziniu/KnapsackRL `verl/utils/dataset/
rl_dataset.py` `update_sample_state`, `get_sample_state`): per prompt, the rollouts ever recorded and
p_hat, the last visit's mean if it had >= 16 rollouts, else the mean of the last 16 rewards.

    KnapsackStats       prompt id -> [rollouts recorded, p_hat, last 16 rewards]; stats(), after(), record()
    WithKnapsackStats   coba.CapabilityTracker with these statistics recorded beside it: every visit the
                        tracker records is recorded here too, and a checkpoint saves both as one state
                        (the tracker's, with a "knapsack" entry, the format checkpoints have always had)

The run's tracker is a WithKnapsackStats (harness/run.py), so that `--allocator knapsack`
(arms/knapsack.py) reads Knapsack-RL's own estimate, not eq. 1's p_i, and coba.py keeps only the
paper's tracker. A file that imports nothing of ours. Choices: docs/method-sources.md §1.

Tests: tests/test_coba.py (the statistics, checkpoints), tests/test_arms.py (a run).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

KNAPSACK_BUFFER = 16    # rl_dataset.py `reward_buffer_length`: p_hat from the last 16 rewards


class KnapsackStats(dict):
    """Knapsack-RL's per-prompt statistics: prompt id -> [rollouts recorded, p_hat, last 16 rewards]."""

    def stats(self, prompt_ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """Knapsack-RL's inputs (arms.allocators.allocate_budgets(..., knapsack_stats=)): p_hat (M,) and
        rollouts recorded (M,); never-seen prompts (0.0, 0), as the official `get_sample_state`."""
        stats = [self.get(int(i), (0, 0.0, ())) for i in prompt_ids]
        return (np.array([s[1] for s in stats], dtype=float), np.array([s[0] for s in stats], dtype=int))

    def after(self, i: int, rewards: list) -> list:
        """Prompt i's statistics [rollouts recorded, p_hat, last 16 rewards] once a visit with these
        rewards is recorded (`update_sample_state`, with its defaults epoch_estimation =
        robust_epoch_estimation = True). Pure: train.py's --probe asks before recording."""
        n, _, last = self.get(int(i), (0, 0.0, []))
        last = (list(last) + list(rewards))[-KNAPSACK_BUFFER:]  # the last 16 rewards, oldest first
        # a visit of >= 16 rollouts is its own estimate; a smaller one borrows from earlier visits
        p_hat = float(np.mean(rewards)) if len(rewards) >= KNAPSACK_BUFFER else float(np.mean(last))
        return [n + len(rewards), p_hat, last]

    def record(self, i: int, rewards: list) -> None:
        """One visit of prompt i."""
        self[int(i)] = self.after(i, rewards)

    def state_dict(self) -> dict:
        """JSON-serialisable: prompt ids become str keys."""
        return {str(i): [int(n), float(p), [float(r) for r in last]] for i, (n, p, last) in self.items()}

    @classmethod
    def from_state(cls, state: dict | None, visits: dict) -> "KnapsackStats":
        """Restore from state_dict(); a checkpoint without the statistics rebuilds them from the
        visits kept (prompt id -> (successes, totals) per visit)."""
        if state is not None:
            return cls({int(i): [int(n), float(p), [float(r) for r in last]] for i, (n, p, last) in state.items()})
        out = cls()
        for i, hist in visits.items():
            for s, n in hist:
                out.record(i, [s / n] * int(n))
        return out


def check_rewards(successes, totals, rewards) -> list | None:
    """Per prompt, the 0/1 rewards of its rollouts in order, as floats; None stays None (each rollout
    then counts successes[i] / totals[i]). One line if they do not match successes and totals."""
    if rewards is None:
        return None
    rewards = [[float(r) for r in rs] for rs in rewards]
    s, n = (np.asarray(x, dtype=float).ravel().tolist() for x in (successes, totals))
    if len(rewards) != len(s) or any(len(rs) != ni or sum(rs) != si for rs, si, ni in zip(rewards, s, n)):
        raise ValueError("update's rewards must hold, per prompt, totals[i] rewards summing to successes[i]")
    return rewards


class WithKnapsackStats:
    """coba.CapabilityTracker with Knapsack-RL's statistics beside it: update() records each visit in
    both, a checkpoint saves and restores both as one state; everything else is the tracker's."""

    def __init__(self, tracker, knapsack: KnapsackStats | None = None):
        self.tracker = tracker
        self.knapsack = KnapsackStats() if knapsack is None else knapsack

    def __getattr__(self, name):  # pass_rates, seen, alpha_beta, f_bar, history, visits, ...: the tracker's
        if name == "tracker":  # asked before __init__ set it (copy, pickle): there is none yet
            raise AttributeError(name)
        return getattr(self.tracker, name)

    def update(self, prompt_ids, successes, totals, rewards=None) -> float:
        """The tracker's update (eq. 1's visits, eq. 4's F_t, returned), then each visit for Knapsack-RL:
        rewards, per prompt in order, are its p_hat's last 16 (without them each rollout counts
        successes[i] / totals[i])."""
        rewards = check_rewards(successes, totals, rewards)  # before anything is recorded
        F_t = self.tracker.update(prompt_ids, successes, totals)
        s, n = (np.asarray(x, dtype=float).tolist() for x in (successes, totals))
        for k, (i, si, ni) in enumerate(zip(prompt_ids, s, n)):
            self.knapsack.record(int(i), rewards[k] if rewards is not None else [si / ni] * int(ni))
        return F_t

    def state_dict(self) -> dict:
        return {**self.tracker.state_dict(), "knapsack": self.knapsack.state_dict()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """A checkpoint without the statistics rebuilds them from the tracker's visits."""
        self.tracker.load_state_dict(state, strict)
        self.knapsack = KnapsackStats.from_state(state.get("knapsack"), self.tracker.visits)
