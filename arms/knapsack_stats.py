"""Knapsack-RL's p estimate (Li et al., arXiv 2509.25849; liziniu/KnapsackRL `verl/utils/dataset/
rl_dataset.py` `update_sample_state`, `get_sample_state`): per prompt, the rollouts ever recorded and
p_hat, the last visit's mean if it had >= 16 rollouts, else the mean of the last 16 rewards.

coba.CapabilityTracker holds one KnapsackStats (`tracker.knapsack`), records every visit into it and
saves it in its checkpoint (the tracker state's "knapsack" entry), so that `--allocator knapsack`
(arms/knapsack.py) reads Knapsack-RL's own estimate, not eq. 1's p_i. A file of its own that imports
nothing of ours, so that coba.py can hold it without importing the allocators (arms/knapsack.py
needs allocate.py and speedups/, whose benchmark imports coba.py). Choices: docs/method-sources.md §1.

Tests: tests/test_coba.py (the tracker's statistics, checkpoints), tests/test_arms.py (a run).
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
