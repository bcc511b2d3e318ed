"""The experiment's statistics (compare.py, docs/results.md): paired differences between arms
over seeds, their t intervals, the smallest difference the design can detect, and the noise of one
evaluation.

The paper compares arms at an equal rollout budget (arXiv 2602.03048 §3, Tables 1-3). Here every arm
runs on the same seeds, and seed s gives every arm the same initial model, prompt order and held-out
set, so an arm is compared with uniform GRPO seed by seed: the paired difference d_s = arm_s - uniform_s
cancels the seed-to-seed noise both share (design).

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
    measure_power      what the rollouts ratio to 80% of the gain reads for a true 1x, 1.5x, 2x speed-up
                       on made-up curves of a lab's shape; fit_rise fits that shape (start, plateau, time
                       constant) to a table's uniform curves; calibrate = both (compare.py --measure-power)

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
    """Rollouts at the first evaluation at or above `target` (None: never). The evaluation grid's
    own value, no interpolation: the table's first "rollouts to uniform's final" column."""
    hit = np.nonzero(y >= target - 1e-12)[0]
    return float(x[hit[0]]) if len(hit) else None


def rollouts_to_reach_interpolated(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    """Rollouts where the curve, drawn straight between evaluations, first reaches `target`."""
    hit = np.nonzero(y >= target - 1e-12)[0]
    if not len(hit):
        return None
    i = int(hit[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))


# Sample efficiency that a flat curve's noise cannot flip (docs/results.md, "How 'reaches' is
# measured"): the rollouts each run needs to reach GAIN_SHARE of its seed's uniform gain, from the
# shared start (evaluation 0: every arm of a seed starts from the same model) to uniform's plateau
# (the mean of its last PLATEAU_EVALS evaluations), interpolated between evaluations. The target then
# lies where the curves still rise, so a shift of a fraction of one evaluation's standard error moves
# the crossing by a fraction of an evaluation interval, where "uniform's final value" (on its own
# plateau) can move it by several.
GAIN_SHARE = 0.8
PLATEAU_EVALS = 4


def plateau(y: np.ndarray, k: int = PLATEAU_EVALS) -> float:
    """Mean of a curve's last k evaluations (at most all but the first)."""
    return float(np.mean(y[-max(1, min(k, len(y) - 1)):]))


def gain_target(base_run: dict, share: float = GAIN_SHARE) -> float | None:
    """start + share * (plateau - start) of one seed's baseline run; None where it gains nothing."""
    y = np.asarray(base_run["acc"], float)
    gain = plateau(y) - y[0]
    return float(y[0] + share * gain) if gain > 0 else None


def ratio_stats(ratios: list[float], at_start: int = 0) -> dict:
    """Geometric mean of per-seed rollout ratios (arm / baseline) with a 95% t interval on the log
    scale; a seed whose arm never gets there counts under "never" and leaves no mean."""
    if not ratios and at_start:
        return {"n": 0, "geo_mean": None, "lo": None, "hi": None, "at_start": at_start}
    if ratios and all(math.isfinite(r) for r in ratios):
        res = paired_t(np.log(ratios))
        return {"n": res["n"], "geo_mean": math.exp(res["mean"]),
                "lo": math.exp(res["lo"]) if math.isfinite(res["lo"]) else None,
                "hi": math.exp(res["hi"]) if math.isfinite(res["hi"]) else None}
    return {"n": len(ratios), "geo_mean": None, "lo": None, "hi": None,
            "never": sum(not math.isfinite(r) for r in ratios)}


def speed_ratio(arm: dict, base: dict, common: list, target_of, reach=rollouts_to_reach) -> dict:
    """Per seed: rollouts the arm needs to reach target_of(seed) over those the baseline needs, then
    ratio_stats. A seed whose baseline is at the target at its first evaluation (or has no target)
    says nothing about speed: counted apart as "at_start", not as a ratio of 1."""
    ratios, at_start = [], 0
    for s in common:
        target = target_of(s)
        b = None if target is None else reach(np.array(base[s]["rollouts"]), np.array(base[s]["acc"]), target)
        if target is None or (b is not None and b <= base[s]["rollouts"][0]):
            at_start += 1
        elif b is not None:
            a = reach(np.array(arm[s]["rollouts"]), np.array(arm[s]["acc"]), target)
            ratios.append(math.inf if a is None else max(a, 1.0) / max(b, 1.0))
    return ratio_stats(ratios, at_start)


def evaluation_se(runs: list[dict]) -> float:
    """One evaluation's standard error at the end of training: the median logged avg@k standard
    error of the final evaluations, else sqrt(p(1-p)/n) at the mean final value (greedy: exact;
    avg@k: its upper bound)."""
    ses = [r["avg_se"][-1] for r in runs if r.get("avg_se") and r["avg_se"][-1] is not None]
    if ses:
        return float(np.median(ses))
    p = float(np.mean([r["final_acc"] for r in runs]))
    n = next((r["heldout_n"] for r in runs if r.get("heldout_n")), None)
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


# The two definitions the table's columns show, as speed_sensitivity names them
FIRST_DEFINITION = "uniform's mean final, first evaluation at or above (the table's)"
GAIN_DEFINITION = f"{GAIN_SHARE:.0%} of each seed's uniform gain, interpolated (the table's second)"


def speed_sensitivity(arm: dict, base: dict, common: list, se: float) -> dict:
    """The rollouts ratio under each reasonable definition of "reaches" (docs/results.md): name ->
    ratio_stats; "leave one out" -> the geometric means with each seed left out in turn."""
    pooled = float(np.mean([base[s]["final_acc"] for s in base]))
    interp = rollouts_to_reach_interpolated
    shifts = ((-1, "-"), (1, "+")) if math.isfinite(se) else ()  # no SE known: no shifted rows
    out = {FIRST_DEFINITION: speed_ratio(arm, base, common, lambda s: pooled)}
    for sign, label in shifts:
        out[f"the same, target {label} SE/5"] = speed_ratio(arm, base, common, lambda s, sign=sign: pooled + sign * se / 5)
    out.update({
        "the same, interpolated": speed_ratio(arm, base, common, lambda s: pooled, interp),
        "each seed's uniform final": speed_ratio(arm, base, common, lambda s: base[s]["final_acc"]),
        "each seed's uniform final, interpolated": speed_ratio(arm, base, common, lambda s: base[s]["final_acc"], interp),
    })
    for share in (0.7, GAIN_SHARE, 0.9):
        name = f"{share:.0%} of each seed's uniform gain, interpolated"
        out[name + (" (the table's second)" if share == GAIN_SHARE else "")] = speed_ratio(
            arm, base, common, lambda s, share=share: gain_target(base[s], share), interp)
    for sign, label in shifts:
        out[f"{GAIN_SHARE:.0%} of the gain, target {label} SE/5"] = speed_ratio(
            arm, base, common, lambda s, sign=sign: None if (g := gain_target(base[s])) is None else g + sign * se / 5,
            interp)
    loo = [speed_ratio(arm, base, [x for x in common if x != s], lambda t: pooled)["geo_mean"] for s in common]
    out["leave one out"] = [g for g in loo if g is not None] if len(common) > 2 else []
    return out


# ----------------------------------------------------------------------------------------------
# The rollouts measure's power: what it reads for a known speed-up on curves shaped like a lab's
# ----------------------------------------------------------------------------------------------
def rise_curve(r, start: float, plateau: float, tau: float):
    """acc(r) = start + (plateau - start) (1 - exp(-r / tau)): a curve rising from start to plateau
    with time constant tau rollouts (63% of the rise by tau, 95% by 3 tau)."""
    return start + (plateau - start) * (1 - np.exp(-np.asarray(r, float) / tau))


def measure_power(start: float, plateau: float, tau_rollouts: float, noise_se: float, grid,
                  speedups=(1.0, 1.5, 2.0), seeds: int = 3, draws: int = 200, seed: int = 0,
                  jitter: float = 0.0) -> list[dict]:
    """What the tables' rollouts measure (80% of each seed's uniform gain, interpolated: speed_ratio
    with gain_target and rollouts_to_reach_interpolated, as compare_arms computes "gain_ratio") reads
    on made-up curves of a known speed-up. Per draw, `seeds` paired seeds; a seed's uniform curve is
    rise_curve(r) and its arm's rise_curve(speedup * r), observed on `grid` (rollouts, the first 0)
    with independent Gaussian noise of sd noise_se at every evaluation, the two sharing the seed's
    start evaluation (the same initial model); jitter > 0 moves each seed's start and plateau (both
    arms alike) by Gaussian noise of that sd. Seeded: the same arguments give the same numbers.
    Returns one row per true speed-up: median_read (median over draws of the geometric mean; a draw
    where an arm never gets there reads inf), share_faster (CI upper bound < 1: the power to see a
    speed-up), share_helps (geometric mean <= 0.7 and CI upper bound < 1: the rule's rollouts route),
    share_ci_holds_1, share_no_read (no geometric mean: an arm never got there, or every seed's
    uniform was at its target at the first evaluation)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(grid, float)
    rows = []
    for speedup in speedups:
        reads, faster, helps, holds, no_read = [], 0, 0, 0, 0
        for _ in range(draws):
            base, arm = {}, {}
            for s in range(seeds):
                a, b = start + rng.normal(0, jitter), plateau + rng.normal(0, jitter)
                first = a + rng.normal(0, noise_se)  # evaluation 0: one model, shared by the seed's arms
                for runs, k in ((base, 1.0), (arm, speedup)):
                    y = rise_curve(k * x, a, b, tau_rollouts) + rng.normal(0, noise_se, len(x))
                    y[0] = first
                    runs[s] = {"rollouts": list(x), "acc": list(y)}
            res = speed_ratio(arm, base, list(base), lambda s: gain_target(base[s]), rollouts_to_reach_interpolated)
            if res["geo_mean"] is None:
                no_read += 1
                if res.get("never"):
                    reads.append(math.inf)
                continue
            reads.append(res["geo_mean"])
            hi, lo = res["hi"], res["lo"]
            faster += hi is not None and hi < 1
            helps += hi is not None and hi < 1 and res["geo_mean"] <= 0.7
            holds += lo is not None and lo <= 1 <= hi
        rows.append({"speedup": float(speedup), "true_ratio": 1 / float(speedup),
                     "median_read": float(np.median(reads)) if reads else None,
                     "share_faster": faster / draws, "share_helps": helps / draws,
                     "share_ci_holds_1": holds / draws, "share_no_read": no_read / draws})
    return rows


def fit_rise(runs: list[dict], baseline: str = "uniform") -> dict:
    """(start, plateau, tau) of rise_curve fitted by least squares (scipy.optimize.curve_fit) to the
    baseline's curves (runs.jsonl rows: "rollouts" against "acc", every seed's points pooled), with
    tau's standard error from the fit; noise_se = evaluation_se of those runs (one evaluation's
    standard error, as the table's footer gives it); grid = their evaluation points; seeds = their
    number; residual_sd = the fit's residuals' sd (evaluation noise plus seed-to-seed spread), and
    jitter = the sd over seeds of each seed's plateau (mean of its last PLATEAU_EVALS evaluations)."""
    from scipy.optimize import curve_fit

    mine = [r for r in runs if r.get("arm", baseline) == baseline]
    if not mine:
        raise ValueError(f"no {baseline} runs to fit")
    x = np.concatenate([np.asarray(r["rollouts"], float) for r in mine])
    y = np.concatenate([np.asarray(r["acc"], float) for r in mine])
    grid = [float(v) for v in mine[0]["rollouts"]]
    start0, end0 = float(np.mean([r["acc"][0] for r in mine])), float(np.mean([r["acc"][-1] for r in mine]))
    p0 = (start0, end0, max(grid[-1] / 4, 1.0))
    (a, b, tau), cov = curve_fit(rise_curve, x, y, p0=p0, bounds=([-1, -1, 1e-6 * grid[-1]], [2, 2, 1e3 * grid[-1]]))
    resid = y - rise_curve(x, a, b, tau)
    plateaus = [plateau(np.asarray(r["acc"], float)) for r in mine]
    return {"start": float(a), "plateau": float(b), "tau": float(tau),
            "tau_se": float(math.sqrt(cov[2, 2])) if np.isfinite(cov[2, 2]) else float("nan"),
            "noise_se": evaluation_se(mine), "grid": grid, "seeds": len(mine),
            "residual_sd": float(np.std(resid, ddof=3)) if len(resid) > 3 else float("nan"),
            "jitter": float(np.std(plateaus, ddof=1)) if len(plateaus) > 1 else 0.0,
            "rise_by_first_eval": float(1 - math.exp(-grid[1] / tau)) if len(grid) > 1 else float("nan")}


def power_report(fit: dict, rows: list[dict], draws: int, rows_residual: list[dict] | None = None) -> str:
    """fit_rise's numbers and measure_power's rows as printed lines (compare.py --measure-power);
    rows_residual: the same with the fit's residual sd as the noise."""
    g = fit["grid"]
    lines = [f"fitted uniform curve ({fit['seeds']} seeds): start {fit['start']:.3f}, plateau {fit['plateau']:.3f}, "
             f"tau {fit['tau']:.0f} rollouts (se {fit['tau_se']:.0f}); {fit['rise_by_first_eval']:.0%} of the rise "
             f"by the first evaluation after the start",
             f"evaluation grid: {len(g)} points, {', '.join(f'{v:g}' for v in g)} rollouts",
             f"noise: one evaluation's SE {fit['noise_se']:.4f} (the fit's residual sd {fit['residual_sd']:.4f}); "
             f"per-seed jitter of start and plateau {fit['jitter']:.4f}"]
    if fit["plateau"] <= fit["start"]:
        lines.append(f"uniform does not rise here (plateau - start = {fit['plateau'] - fit['start']:+.3f}): the "
                     f"rollouts to {GAIN_SHARE:.0%} of its gain measure nothing, and no power is computed")
        return "\n".join(lines)
    for noise, label, rs in ((fit["noise_se"], "one evaluation's SE", rows),
                             (fit["residual_sd"], "the fit's residual sd", rows_residual)):
        if rs is None:
            continue
        lines += [f"\nthe rollouts ratio to {GAIN_SHARE:.0%} of uniform's gain on made-up curves of this shape, "
                  f"{fit['seeds']} paired seeds, {draws} draws, noise {noise:.4f} ({label}):\n",
                  "| true speed-up | true ratio | median read | CI upper < 1 (power) | <= 0.7x with CI upper < 1 "
                  "(the rule's 'helps') | CI holds 1 | no read |",
                  "|---|---|---|---|---|---|---|"]
        for r in rs:
            read = "-" if r["median_read"] is None else f"{r['median_read']:.2f}"
            lines.append(f"| {r['speedup']:g}x | {r['true_ratio']:.2f} | {read} | {r['share_faster']:.2f} | "
                         f"{r['share_helps']:.2f} | {r['share_ci_holds_1']:.2f} | {r['share_no_read']:.2f} |")
    return "\n".join(lines)


def calibrate(runs: list[dict], baseline: str = "uniform", draws: int = 200, seed: int = 0) -> dict:
    """The rollouts measure's power at one table's shape: fit_rise on its baseline runs, then
    measure_power (1x, 1.5x, 2x; the table's number of seeds; per-seed jitter as fitted) with the
    noise of one evaluation's SE and, beside it, the fit's residual sd. None where uniform does not
    rise. {"fit", "rows", "rows_residual", "text"}."""
    fit = fit_rise(runs, baseline)
    rows = rows_residual = None
    if fit["plateau"] > fit["start"]:
        shape = (fit["start"], fit["plateau"], fit["tau"])
        rows = measure_power(*shape, fit["noise_se"], fit["grid"], seeds=fit["seeds"], draws=draws, seed=seed,
                             jitter=fit["jitter"])
        rows_residual = measure_power(*shape, fit["residual_sd"], fit["grid"], seeds=fit["seeds"], draws=draws,
                                      seed=seed, jitter=fit["jitter"])
    return {"fit": fit, "rows": rows, "rows_residual": rows_residual,
            "text": power_report(fit, rows, draws, rows_residual)}

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
    """--pass-rate-source oracle: the oracle's rollouts (not trained on, not counted) and how far
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
    se = evaluation_se(list(base.values())) if base else float("nan")  # one evaluation's, for the sensitivity rows
    summary, diffs = [], []
    for arm, seeds in by.items():
        mine = list(seeds.values())
        row = {"type": "summary", "arm": arm, "seeds": sorted(seeds), "target_acc": target}
        for key in ("final_acc", "auc", "zero_signal_group_share", "zero_signal_rollout_share", "train_seconds",
                    "prompts_at_min_budget"):
            vals = np.array([r[key] for r in mine], float)
            row[f"{key}_mean"], row[f"{key}_std"] = float(np.mean(vals)), float(np.std(vals))
        # a runs.jsonl older than the comparison arms has no "updates": one alpha_t per update (None: unknown)
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
        # rollouts-to-target ratio, seed by seed (speed_ratio): to uniform's mean final value at the
        # first evaluation at or above it, and (gain_ratio) to GAIN_SHARE of each seed's uniform gain,
        # interpolated; a run that never reaches the target has ratio inf.
        sensitivity = speed_sensitivity(seeds, base, common, se)
        d["rollout_ratio"], d["gain_ratio"] = sensitivity[FIRST_DEFINITION], sensitivity[GAIN_DEFINITION]
        d["reach_sensitivity"] = sensitivity
        d["plateau"] = paired_t([plateau(np.array(seeds[s]["acc"], float)) - plateau(np.array(base[s]["acc"], float))
                                 for s in common])
        diffs.append(d)
    # How long each arm ran (updates, generation blocks, rollouts) is recorded only where the arms
    # differ in it (a DAPO arm): a sweep of equal-length arms keeps the summary rows it always had,
    # so its redraw changes no committed byte.
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


def _ratio(r: dict, baseline: str = "uniform") -> str:
    """A ratio_stats cell: geometric mean [95% CI], or why there is none."""
    if r["geo_mean"] is not None:
        return f"{r['geo_mean']:.2f}" + (f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r["lo"] is not None else "")
    if r.get("at_start"):
        return f"n/a: {baseline} starts at or above its target on {r['at_start']} seeds"
    return f"never on {r.get('never', '?')}/{r['n']} seeds"


def sensitivity_table(diffs: list[dict], metric: str = "greedy", baseline: str = "uniform") -> str:
    """How much the rollouts ratio moves with the definition of "reaches" (stats.speed_sensitivity),
    one row a definition, one column an arm; then the plateau level (mean of the last evaluations)."""
    diffs = [d for d in diffs if "reach_sensitivity" in d]
    if not diffs:
        return ""
    name = "greedy acc" if metric == "greedy" else metric
    lines = [f"\nRollouts to reach {baseline}'s level, arm / {baseline}, under other definitions of \"reaches\" "
             f"(geometric mean over seeds [95% CI]; SE = one evaluation's standard error):\n",
             "| definition | " + " | ".join(d["arm"] for d in diffs) + " |",
             "|---|" + "---|" * len(diffs)]
    for key in diffs[0]["reach_sensitivity"]:
        if key == "leave one out":
            cells = [(f"{min(g):.2f} to {max(g):.2f} over {len(g)} sets" if g else "-")
                     for d in (x for x in diffs) for g in [d["reach_sensitivity"][key]]]
            key = f"{baseline}'s mean final, leave one seed out (range of geometric means)"
        else:
            cells = [_ratio(d["reach_sensitivity"][key], baseline) for d in diffs]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append(f"| plateau {name} (mean of the last {PLATEAU_EVALS} evaluations) - {baseline} | "
                 + " | ".join(_ci(d["plateau"]) for d in diffs) + " |")
    return "\n".join(lines)


def markdown_table(summary: list[dict], diffs: list[dict], metric: str = "greedy", pass_k: int | None = None,
                   footer: list[str] = (), hard_label: str = "", baseline: str = "uniform") -> str:
    """The table: the primary metric's final value, AUC, paired differences with 95% CIs and the
    rollouts-to-target ratio; then the secondary metrics (value, and difference from uniform): greedy
    accuracy, pass@k, and the primary metric on the held-out set's hardest level."""
    name = "greedy acc" if metric == "greedy" else metric
    diff = {d["arm"]: d for d in diffs}
    extra = [(key, label) for key, label in (("final_greedy", "greedy acc"), ("final_pass", f"pass@{pass_k}"),
                                             ("final_hard", f"{name}, hardest level{hard_label}"))
             if summary and f"{key}_mean" in summary[0]]
    show_signal = bool(summary) and "signal_prompts_mean" in summary[0]  # see signal_prompts()
    # equal rollouts, not equal steps: where arms made different numbers of updates (DAPO), a column says so
    show_updates = len({s.get("updates_mean") for s in summary}) > 1
    lines = [f"| arm | final {name} | AUC ({name}) | final {name} - {baseline} [95% CI] | AUC - {baseline} [95% CI] "
             f"| rollouts to {baseline}'s final {name}, ratio [95% CI] "
             f"| rollouts to {GAIN_SHARE:.0%} of {baseline}'s gain, ratio [95% CI] | "
             + "".join(f"final {label} (- {baseline} [95% CI]) | " for _, label in extra) + "zero-signal rollouts |"
             + (" prompts carrying signal per step (effective) |" if show_signal else "")
             + (" updates (same rollouts) |" if show_updates else ""),
             "|---|---|---|---|---|---|---|" + "---|" * len(extra) + "---|" + ("---|" if show_signal else "")
             + ("---|" if show_updates else "")]
    for s in summary:
        d = diff.get(s["arm"])
        if d is None:
            cells = ["(baseline)", "(baseline)", f"1 ({s['reached']} seeds reach {s['target_acc']:.3f})", "1"]
            cells += [f"{s[f'{key}_mean']:.3f} (baseline)" for key, _ in extra]
        else:
            r = d["rollout_ratio"]
            ratio = (_ratio(r, baseline) if not r.get("at_start") or r["geo_mean"] is not None else
                     f"n/a: {baseline} starts at or above its final value on {r['at_start']} seeds")
            cells = [_ci(d["final_acc"]), _ci(d["auc"]), ratio, _ratio(d["gain_ratio"], baseline)]
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
    sensitivity = sensitivity_table(diffs, metric, baseline)
    return "\n".join(lines + ([sensitivity] if sensitivity else []))
