"""Golden step for the other arms: knapsack, coba-released, and --probe (with coba and knapsack).

tests/test_step.py checks the paper's arm against `correct_step`; a one-line break in another arm's
wiring could still leave it green (the released allocator handed the all-prompt tau instead of
"adaptive", coba-released without its (kappa - 2, 2) start, the probe's own successes / B_low
instead of the pooled pass rate). Here the same known rollouts (test_step.FixedRollouts) drive
train.main, and `Expected` below recomputes, without train.py's helpers, what each step must hand
the allocator and record in the tracker:

  - allocator inputs: arm name, p_i (last visits; with --probe pooled with this step's B_low rows),
    seen_i, Knapsack-RL's (p_hat, rollouts recorded), alpha_t / beta_t, and tau ("adaptive" as is);
  - generation rounds: B_i per prompt, or with --probe B_low each, then the B_i - B_low not drawn;
  - tracker updates: per prompt successes_i, B_i and the rewards in row order (probe rows first),
    and its Knapsack-RL statistics after the update (the last 16 rewards, oldest first).

Run: python -m pytest -q tests/test_arms.py   (a few seconds per arm on one core)
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from engines import checkpoint
import coba
from arms.knapsack_stats import WithKnapsackStats
import train
from harness import run as run_setup
from test_step import BASE, FixedRollouts, is_correct

KNAPSACK_BUFFER = 16  # Knapsack-RL keeps each prompt's last 16 rewards (its `update_sample_state`)


class Expected:
    """What the tracker must know after each step, kept by hand from the known rewards."""

    def __init__(self, args):
        self.args = args
        self.visits: dict[int, list[tuple[float, float]]] = {}  # j -> [(successes, rollouts)] per visit
        self.knapsack: dict[int, tuple[int, float, list]] = {}  # j -> (recorded, p_hat, last 16 rewards)
        self.F: list[float] = []  # F_t per step

    def pass_rate(self, j: int, probe: list[float] = ()) -> float:
        """Eq. 1 over the last --failure-window visits, pooled with this step's probe rewards."""
        hist = self.visits.get(j, [])[-self.args.failure_window:]
        n = sum(v[1] for v in hist) + len(probe)
        return (sum(v[0] for v in hist) + sum(probe)) / n if n else self.args.prior

    def knapsack_after(self, j: int, rewards: list[float]) -> tuple[int, float, list]:
        n, p_hat, last = self.knapsack.get(j, (0, 0.0, []))
        if not rewards:
            return n, p_hat, last
        last = (last + list(rewards))[-KNAPSACK_BUFFER:]
        p_hat = float(np.mean(rewards if len(rewards) >= KNAPSACK_BUFFER else last))
        return n + len(rewards), p_hat, last

    def alpha_beta(self, step: int) -> tuple[float, float]:
        a = self.args
        if a.allocator == "coba-released" and not self.F:  # the released code's start (kappa - 2, 2)
            return a.kappa - 2.0, 2.0
        F_bar = float(np.mean(self.F[-a.failure_window:])) if self.F else 1.0 - a.prior
        return coba.schedule_params(a.schedule_obj, coba.transform_failure_rate(F_bar, a.gamma), a.kappa,
                                    step / a.steps)

    def record(self, prompt_idx: list[int], rewards: list[list[float]]) -> None:
        for j, rs in zip(prompt_idx, rewards):
            self.visits.setdefault(j, []).append((float(sum(rs)), float(len(rs))))
            self.knapsack[j] = self.knapsack_after(j, rs)
        self.F.append(1.0 - float(np.mean([sum(rs) / len(rs) for rs in rewards])))


def run_arm(tmp_path, monkeypatch, extra: list[str]) -> dict:
    """train.main on FixedRollouts with spies on the allocator and the tracker."""
    from toy import build_tokenizer

    rec = {"allocate": [], "update": []}
    real_load_data, real_alloc = run_setup.load_data, train.allocators.allocate_budgets
    real_update = WithKnapsackStats.update

    def load_data(args, *a, **kw):
        train_set, evals = real_load_data(args, *a, **kw)
        rec["records"], rec["rollouts"] = train_set, FixedRollouts(build_tokenizer(), train_set)
        monkeypatch.setattr(train, "generate_groups", rec["rollouts"])
        return train_set, evals

    def allocate_budgets(*a, **kw):
        out = real_alloc(*a, **kw)
        rec["allocate"].append({"args": copy.deepcopy(a), "kw": copy.deepcopy(kw), "out": list(out)})
        return out

    def update(self, prompt_ids, successes, totals, rewards=None):
        F_t = real_update(self, prompt_ids, successes, totals, rewards=rewards)
        ids = [int(i) for i in prompt_ids]
        rec["update"].append({"ids": ids, "successes": [float(s) for s in successes],
                              "totals": [int(n) for n in totals], "rewards": copy.deepcopy(rewards),
                              "knapsack": {i: copy.deepcopy(self.knapsack[i]) for i in ids}, "F_t": F_t})
        return F_t

    monkeypatch.setattr(run_setup, "load_data", load_data)
    monkeypatch.setattr(train.allocators, "allocate_budgets", allocate_budgets)
    monkeypatch.setattr(WithKnapsackStats, "update", update)
    flags = BASE + ["--num-mini-batches", "1"] + extra + ["--output-dir", str(tmp_path)]
    ap = train.build_parser()
    rec["args"] = train.resolve_args(ap.parse_args(flags), ap)
    train.main(flags)
    monkeypatch.undo()
    rec["steps"] = [r for r in checkpoint.read_log(tmp_path / "log.jsonl") if r["type"] == "train"]
    rec["gen"] = [c["budgets"] for c in rec["rollouts"].calls if not c["greedy"]]  # the eval is greedy
    return rec


def check_arm(rec: dict) -> None:
    """Every step's allocator inputs, generation rounds and tracker update against Expected."""
    args, exp = rec["args"], Expected(rec["args"])
    B_low, M = args.min_budget, args.prompts_per_step
    rounds = 2 if args.probe else 1
    assert len(rec["allocate"]) == len(rec["update"]) == len(rec["steps"]) == args.steps
    assert len(rec["gen"]) == rounds * args.steps
    for s, (r, call, up) in enumerate(zip(rec["steps"], rec["allocate"], rec["update"])):
        idx, a, kw = r["prompt_idx"], call["args"], call["kw"]
        probe = [[float(is_correct(j, k)) for k in range(B_low)] if args.probe else [] for j in idx]
        # step 2: what the allocator is handed
        assert a[0] == args.allocator, s
        np.testing.assert_allclose(a[1], [exp.pass_rate(j, p) for j, p in zip(idx, probe)], atol=1e-12,
                                   err_msg=f"step {s}: pass rates")
        assert list(np.asarray(a[2], dtype=bool)) == [args.probe or j in exp.visits for j in idx], s
        assert tuple(a[3:6]) == (args.total_budget, B_low, args.max_budget), s
        assert (a[6], a[7]) == pytest.approx(exp.alpha_beta(s), abs=1e-9), (s, a[6:8])  # the test's own float64 recomputation: rounding only
        assert a[8] == ("adaptive" if args.tau == "adaptive" else float(args.tau)), (s, a[8])
        assert kw["solver"] == args.solver
        want_ks = [exp.knapsack_after(j, p) for j, p in zip(idx, probe)]
        if args.allocator != "knapsack":  # asked only by its arm (arms/steps.py KnapsackRates)
            assert "knapsack_stats" not in kw, s
        else:
            np.testing.assert_allclose(kw["knapsack_stats"][0], [k[1] for k in want_ks], atol=1e-12,
                                       err_msg=f"step {s}: Knapsack-RL p_hat")
            assert list(kw["knapsack_stats"][1]) == [k[0] for k in want_ks], s
        budgets = call["out"]
        assert budgets == r["budgets"] and sum(budgets) == args.total_budget, s
        # steps 3-4: the generation rounds (with --probe: B_low each, then the rest)
        gen = rec["gen"][rounds * s:rounds * (s + 1)]
        assert gen == ([[B_low] * M, [B - B_low for B in budgets]] if args.probe else [budgets]), (s, gen)
        # step 5: the tracker gets each prompt's rows in order (probe rows first), their sum and B_i
        rest = [B - B_low if args.probe else B for B in budgets]
        rewards = [p + [float(is_correct(j, k)) for k in range(n)] for j, p, n in zip(idx, probe, rest)]
        assert up["ids"] == idx and up["totals"] == budgets, s
        assert up["rewards"] == rewards, s
        assert up["successes"] == [sum(rs) for rs in rewards], s
        exp.record(idx, rewards)
        for j in idx:
            n, p_hat, last = up["knapsack"][j]
            assert (n, list(last)) == (exp.knapsack[j][0], exp.knapsack[j][2]), (s, j)
            assert p_hat == pytest.approx(exp.knapsack[j][1], abs=1e-9), (s, j)  # the test's own float64 recomputation: rounding only
        assert up["F_t"] == pytest.approx(exp.F[-1], abs=1e-9) and r["F_t"] == pytest.approx(exp.F[-1])  # the test's own float64 recomputation: rounding only
        # the log shows the allocator's view of this step
        assert r["pass_rates"] == [round(float(p), 4) for p in a[1]] and r["seen"] == int(np.sum(a[2])), s  # exact: the allocator's own numbers, rounded the same way
        assert r["tau"] == pytest.approx(coba.resolve_tau(args.tau, np.asarray(a[1], dtype=float))), s
    if args.allocator != "uniform":
        assert any(b != [args.num_generations] * M for b in (c["out"] for c in rec["allocate"])), \
            "fixture must reallocate"


@pytest.mark.parametrize("extra", [
    # 6 steps of 4-16 rollouts: the last 16 rewards are cut inside a visit, so their order matters
    ["--allocator", "knapsack", "--steps", "6", "--max-budget", "16"],
    ["--allocator", "coba-released"],
    ["--allocator", "coba-released", "--tau", "6.0", "--failure-window", "2"],
    ["--allocator", "coba", "--probe", "--failure-window", "2"],
    ["--allocator", "knapsack", "--probe", "--steps", "6", "--max-budget", "16"],
], ids=["knapsack", "coba-released", "coba-released-tau", "probe-coba", "probe-knapsack"])
def test_arm_wiring(tmp_path, toy_model_dir, monkeypatch, extra):
    """Each arm's allocator inputs, generation rounds and tracker updates equal Expected's."""
    check_arm(run_arm(tmp_path, monkeypatch, extra))
