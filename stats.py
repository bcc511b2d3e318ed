"""The experiment's statistics (compare.py, docs/results.md): paired differences between arms
over seeds, their t intervals, the smallest difference the design can detect, and the noise of one
evaluation.

The paper compares arms at an equal rollout budget (arXiv 2602.03048 §3, Tables 1-3). Here every arm
runs on the same seeds, and seed s gives every arm the same initial model, prompt order and held-out
set, so an arm is compared with uniform GRPO seed by seed: the paired difference d_s = arm_s - uniform_s
cancels the seed-to-seed noise both share (issue 12's design).

    t_quantile         Student t quantile t_(q, df), scipy.stats, to three decimals as printed
                       tables give it (T975, T80: df = 1..30), so committed tables redraw byte for byte
    paired_t           mean of the d_s with a two-sided 95% t interval, n - 1 degrees of freedom
    min_detectable     the smallest true mean difference a two-sided 5% paired t test finds with 80%
                       power: (t_.975 + t_.80) * sd / sqrt(n)
    auc, rollouts_to_reach   a run's curve: average accuracy over training, rollouts to a target
    signal_prompts     over how many prompts a step's gradient is spread (an effective number)
    oracle_stats       the coba-oracle diagnostic's cost and how stale the tracker's p_i were
    compare_arms       per arm: means over seeds; against the baseline, paired differences of the
                       final value and AUC (and the secondary metrics) with 95% CIs and detectable
                       differences, and the rollouts-to-target ratio (geometric mean, CI on the log)
    evaluation_noise   the standard error of one evaluation over the held-out set (the table's footer)

Departures: beyond df = 30 the hand-typed tables this replaces used the normal quantiles (1.960,
0.842); the t quantile is used at every df (no committed table has more than 31 seeds).
Tests: tests/test_compare.py (by hand, and the quantiles against the t CDF), tests/test_regime.py.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats


# ----------------------------------------------------------------------------------------------
# Student t quantiles
# ----------------------------------------------------------------------------------------------
def t_quantile(q: float, df: int) -> float:
    """t_(q, df), the q quantile of Student's t with df degrees of freedom (q = .975: a two-sided 95%
    interval; q = .80: 80% power), rounded to three decimals as the printed tables give it: the
    tables this file once held, so the committed results redraw to the same bytes."""
    return round(float(scipy_stats.t.ppf(q, df)), 3)


T975 = [t_quantile(0.975, df) for df in range(1, 31)]  # t_(.975, df), df = 1..30, as printed tables list it
T80 = [t_quantile(0.80, df) for df in range(1, 31)]  # t_(.80, df)


# ----------------------------------------------------------------------------------------------
# Paired statistics: arm - uniform on the same seed
# ----------------------------------------------------------------------------------------------
def paired_t(diffs) -> dict:
    """Mean of paired differences with a two-sided 95% t interval (n - 1 degrees of freedom)."""
    d = np.asarray(diffs, float)
    n, mean = len(d), float(np.mean(d)) if len(d) else float("nan")
    if n < 2:
        return {"n": n, "mean": mean, "lo": float("nan"), "hi": float("nan"), "sd": float("nan")}
    sd = float(np.std(d, ddof=1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half, "sd": sd}


def min_detectable(sd: float, n: int) -> float:
    """Smallest true paired difference found with 80% power by a two-sided 5% paired t test:
    (t_.975 + t_.80) * sd / sqrt(n), sd = the standard deviation of the paired differences."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * sd / math.sqrt(n)


# ----------------------------------------------------------------------------------------------
# One run's numbers: its curve (accuracy against rollouts), where its gradient went, its oracle
# ----------------------------------------------------------------------------------------------
def auc(x: np.ndarray, y: np.ndarray) -> float:
    """Average accuracy over training: trapezoid area under acc(rollouts) divided by the span."""
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0])) if len(x) > 1 else float(y[-1])


def rollouts_to_reach(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    hit = np.nonzero(y >= target - 1e-12)[0]
    return float(x[hit[0]]) if len(hit) else None


def signal_prompts(train: list[dict]) -> float | None:
    """How many prompts the gradient is spread over, per step, averaged over steps: the effective
    number (inverse Simpson index) of the groups that carry signal (0 < group reward < 1; the
    others have zero advantage), each weighted by its rollouts B_i,
        n_eff = (sum_i B_i)^2 / sum_i B_i^2   over those groups.
    Why rollouts: with token-mean aggregation (grpo.aggregate_loss) a prompt's share of the loss
    grows with its B_i, so 4 groups of 32 weigh like 4 prompts, 16 groups of 8 like 16. Uniform
    GRPO's n_eff is just its number of signal groups; an allocator that concentrates the budget
    buys more signal rollouts on fewer prompts. None for logs without group rewards."""
    per_step = []
    for r in train:
        if "group_reward" not in r:
            return None
        B, g = np.array(r["budgets"], float), np.array(r["group_reward"], float)
        sig = B[(g > 0) & (g < 1)]
        per_step.append(sig.sum() ** 2 / (sig ** 2).sum() if len(sig) else 0.0)
    return float(np.mean(per_step)) if per_step else None


def oracle_stats(train: list[dict]) -> dict:
    """--pass-rate-source oracle (issue 42): the oracle's rollouts (not trained on, not counted) and how far
    the tracker's estimate (the last visit's, what coba allocates on) was from the oracle's current pass
    rate: mean |p_stale - p_oracle| over the prompts seen before. {} for other arms."""
    if not train or "oracle_rollouts" not in train[0]:
        return {}
    errors = [abs(a - b) for r in train for a, b in zip(r["stale_pass_rates"], r["pass_rates"]) if a is not None]
    return {"oracle_rollouts": sum(r["oracle_rollouts"] for r in train),
            "oracle_seconds": round(sum(r["oracle_seconds"] for r in train), 1),
            "stale_error": float(np.mean(errors)) if errors else None}


# ----------------------------------------------------------------------------------------------
# The comparison: every arm against the baseline, seed by seed
# ----------------------------------------------------------------------------------------------
SECONDARY = ("final_greedy", "final_pass", "final_hard")  # per-run keys of the secondary metrics


def compare_arms(runs: list[dict], baseline: str = "uniform") -> tuple[list[dict], list[dict]]:
    """Per arm: means over seeds; vs the baseline (paired by seed): differences with 95% CIs and
    the rollouts ratio to reach the baseline's mean final accuracy."""
    by = {}
    for r in runs:
        by.setdefault(r["arm"], {})[r["seed"]] = r
    base = by.get(baseline, {})
    # secondary metrics (greedy accuracy, pass@k beside a primary avg@k; also paired against the
    # baseline below) and signal_prompts (described only): where every run has them
    optional = [key for key in (*SECONDARY, "signal_prompts") if runs and all(r.get(key) is not None for r in runs)]
    secondary = [key for key in optional if key in SECONDARY]
    target = float(np.mean([r["final_acc"] for r in base.values()])) if base else float("nan")
    summary, diffs = [], []
    for arm, seeds in by.items():
        mine = list(seeds.values())
        row = {"type": "summary", "arm": arm, "seeds": sorted(seeds), "target_acc": target}
        for key in ("final_acc", "auc", "zero_signal_group_share", "zero_signal_rollout_share", "train_seconds",
                    "prompts_at_min_budget"):
            vals = np.array([r[key] for r in mine], float)
            row[f"{key}_mean"], row[f"{key}_std"] = float(np.mean(vals)), float(np.std(vals))
        # a runs.jsonl from before issue 36 has no "updates": one alpha_t per update (None: unknown)
        updates = [r.get("updates", len(r.get("alpha_t") or []) or None) for r in mine]
        if None not in updates:
            row["updates_mean"] = float(np.mean(updates))
            row["blocks_mean"] = float(np.mean([r.get("blocks", u) for r, u in zip(mine, updates)]))
        if all("total_rollouts" in r for r in mine):
            row["total_rollouts_mean"] = float(np.mean([r["total_rollouts"] for r in mine]))
        for key in optional:
            vals = np.array([r[key] for r in mine], float)
            row[f"{key}_mean"], row[f"{key}_std"] = float(np.mean(vals)), float(np.std(vals))
        reach = [rollouts_to_reach(np.array(r["rollouts"]), np.array(r["acc"]), target) for r in mine]
        got = [v for v in reach if v is not None]
        row["reached"], row["rollouts_to_target_mean"] = f"{len(got)}/{len(mine)}", (
            float(np.mean(got)) if got else None)
        summary.append(row)
        if arm == baseline:
            continue
        common = sorted(set(seeds) & set(base))
        d = {"type": "paired", "arm": arm, "baseline": baseline, "seeds": common}
        for key in ("final_acc", "auc"):
            res = paired_t([seeds[s][key] - base[s][key] for s in common])
            d[key] = res
            d[f"{key}_min_detectable"] = min_detectable(res["sd"], res["n"])
        for key in secondary:
            d[key] = paired_t([seeds[s][key] - base[s][key] for s in common])
        # rollouts-to-target ratio, seed by seed; a run that never reaches the target has ratio inf.
        # A seed whose baseline is already at the target at its first evaluation says nothing about
        # speed (a model that loses accuracy in training starts above its own final value): counted
        # apart as "at_start" instead of a ratio of 1 that reads like "as fast as uniform".
        ratios, at_start = [], 0
        for s in common:
            a = rollouts_to_reach(np.array(seeds[s]["rollouts"]), np.array(seeds[s]["acc"]), target)
            b = rollouts_to_reach(np.array(base[s]["rollouts"]), np.array(base[s]["acc"]), target)
            if b is not None and b <= base[s]["rollouts"][0]:
                at_start += 1
            elif b is not None:
                ratios.append(math.inf if a is None else max(a, 1.0) / max(b, 1.0))
        if not ratios and at_start:
            d["rollout_ratio"] = {"n": 0, "geo_mean": None, "lo": None, "hi": None, "at_start": at_start}
        elif ratios and all(math.isfinite(r) for r in ratios):
            res = paired_t(np.log(ratios))
            d["rollout_ratio"] = {"n": res["n"], "geo_mean": math.exp(res["mean"]),
                                  "lo": math.exp(res["lo"]) if math.isfinite(res["lo"]) else None,
                                  "hi": math.exp(res["hi"]) if math.isfinite(res["hi"]) else None}
        else:
            d["rollout_ratio"] = {"n": len(ratios), "geo_mean": None, "lo": None, "hi": None,
                                  "never": sum(not math.isfinite(r) for r in ratios)}
        diffs.append(d)
    # How long each arm ran (updates, generation blocks, rollouts) is recorded only where the arms
    # differ in it (a DAPO arm): a sweep of equal-length arms keeps the summary rows it had before
    # issue 36, so its redraw changes no committed byte (issue 32).
    lengths = ("updates_mean", "blocks_mean", "total_rollouts_mean")
    if len({tuple(s.get(k) for k in lengths) for s in summary}) <= 1:
        for s in summary:
            for k in lengths:
                s.pop(k, None)
    return summary, diffs


# ----------------------------------------------------------------------------------------------
# The noise of one evaluation (the table's footer)
# ----------------------------------------------------------------------------------------------
def evaluation_noise(runs: list[dict], metric: str, n: int | None) -> list[str]:
    """Footer lines: the standard error of one evaluation over the held-out set. avg@k: the std of
    the per-problem means / sqrt(n), as train.py logs it (`heldout_avg@k_se`); without that log only
    bounds are known: between p(1-p)/(k n) (every problem equally hard) and p(1-p)/n (each problem
    always or never solved). Greedy: exactly sqrt(p(1-p)/n), each problem being 0 or 1."""
    if not runs or not n:
        return []
    lines = []
    if metric != "greedy":
        k = int(metric.split("@")[1])
        ses = [v for r in runs for v in (r.get("avg_se") or []) if v is not None]
        p = float(np.mean([r["final_acc"] for r in runs]))
        if ses and all(r.get("avg_se") and None not in r["avg_se"] for r in runs):
            lines.append(f"Standard error of one {metric} evaluation over the n = {n} held-out problems (std of "
                         f"the per-problem means / sqrt(n), measured at every evaluation of every run): "
                         f"{min(ses):.4f} to {max(ses):.4f}, median {float(np.median(ses)):.4f}.")
        else:
            lines.append(f"Standard error of one {metric} evaluation over the n = {n} held-out problems: not "
                         f"logged by these runs; at the mean final {metric} p = {p:.3f} it lies between "
                         f"sqrt(p(1-p)/({k}n)) = {math.sqrt(p * (1 - p) / (k * n)):.4f} (no between-problem "
                         f"variance) and sqrt(p(1-p)/n) = {math.sqrt(p * (1 - p) / n):.4f}.")
    key = "final_acc" if metric == "greedy" else "final_greedy"
    if all(r.get(key) is not None for r in runs):
        g = float(np.mean([r[key] for r in runs]))
        lines.append(f"Standard error of one greedy evaluation (n = {n}, each problem 0 or 1): "
                     f"sqrt(p(1-p)/n) = {math.sqrt(g * (1 - g) / n):.4f} at p = {g:.3f}.")
    return lines


# ----------------------------------------------------------------------------------------------
# The table: the primary metric, paired differences with 95% CIs, the smallest detectable difference
# ----------------------------------------------------------------------------------------------
def _ci(d: dict) -> str:
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" if d["n"] > 1 else f"{d['mean']:+.3f}"


def markdown_table(summary: list[dict], diffs: list[dict], metric: str = "greedy", pass_k: int | None = None,
                   footer: list[str] = (), hard_label: str = "", baseline: str = "uniform") -> str:
    """The table: the primary metric's final value, AUC, paired differences with 95% CIs and the
    rollouts-to-target ratio; then the secondary metrics (value, and difference from uniform): greedy
    accuracy, pass@k, and the primary metric on the held-out set's hardest level (issue 42)."""
    name = "greedy acc" if metric == "greedy" else metric
    diff = {d["arm"]: d for d in diffs}
    extra = [(key, label) for key, label in (("final_greedy", "greedy acc"), ("final_pass", f"pass@{pass_k}"),
                                             ("final_hard", f"{name}, hardest level{hard_label}"))
             if summary and f"{key}_mean" in summary[0]]
    show_signal = bool(summary) and "signal_prompts_mean" in summary[0]  # see signal_prompts()
    # equal rollouts, not equal steps: where arms made different numbers of updates (DAPO), a column says so
    show_updates = len({s.get("updates_mean") for s in summary}) > 1
    lines = [f"| arm | final {name} | AUC ({name}) | final {name} - {baseline} [95% CI] | AUC - {baseline} [95% CI] "
             f"| rollouts to {baseline}'s final {name}, ratio [95% CI] | "
             + "".join(f"final {label} (- {baseline} [95% CI]) | " for _, label in extra) + "zero-signal rollouts |"
             + (" prompts carrying signal per step (effective) |" if show_signal else "")
             + (" updates (same rollouts) |" if show_updates else ""),
             "|---|---|---|---|---|---|" + "---|" * len(extra) + "---|" + ("---|" if show_signal else "")
             + ("---|" if show_updates else "")]
    for s in summary:
        d = diff.get(s["arm"])
        if d is None:
            cells = ["(baseline)", "(baseline)", f"1 ({s['reached']} seeds reach {s['target_acc']:.3f})"]
            cells += [f"{s[f'{key}_mean']:.3f} (baseline)" for key, _ in extra]
        else:
            r = d["rollout_ratio"]
            ratio = (f"{r['geo_mean']:.2f}" + (f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r["lo"] is not None else "")
                     if r["geo_mean"] is not None else
                     f"n/a: {baseline} starts at or above its final value on {r['at_start']} seeds" if r.get("at_start")
                     else f"never on {r.get('never', '?')}/{r['n']} seeds")
            cells = [_ci(d["final_acc"]), _ci(d["auc"]), ratio]
            cells += [f"{s[f'{key}_mean']:.3f} ({_ci(d[key])})" for key, _ in extra]
        lines.append(f"| {s['arm']} | {s['final_acc_mean']:.3f} ± {s['final_acc_std']:.3f} "
                     f"| {s['auc_mean']:.3f} ± {s['auc_std']:.3f} | " + " | ".join(cells)
                     + f" | {s['zero_signal_rollout_share_mean']:.2f} |"
                     + (f" {s['signal_prompts_mean']:.1f} |" if show_signal else "")
                     + (f" {s['updates_mean']:.1f} |" if show_updates else ""))
    mdes = [d["final_acc_min_detectable"] for d in diffs if math.isfinite(d["final_acc_min_detectable"])]
    if mdes:
        lines.append(f"\nSmallest detectable difference in final {name} (80% power, paired t, "
                     f"n = {diffs[0]['final_acc']['n']} seeds): {min(mdes):.3f} to {max(mdes):.3f} "
                     f"(AUC: {min(d['auc_min_detectable'] for d in diffs):.3f} to "
                     f"{max(d['auc_min_detectable'] for d in diffs):.3f}).")
    lines += [("\n" if i == 0 else "") + f for i, f in enumerate(footer)]
    return "\n".join(lines)
