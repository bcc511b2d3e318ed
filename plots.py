"""Pictures: one run's own (train.py at the end of a run; `python plots.py RUN_DIR` for any run), and
the equal-budget comparison's (compare.py). One place knows how to draw each figure.

A run's figures, from OUTPUT_DIR/log.jsonl alone, into OUTPUT_DIR/plots/:
    accuracy_reward.png      every held-out accuracy the eval records hold (greedy heldout_acc;
                             heldout_avg@k and heldout_pass@k with --eval-samples k) and the training
                             reward, against rollouts consumed
    capability.png           F_t (eq. 4) and F_bar with the 0.5 line where eq. 6 switches branch;
                             alpha_t and beta_t (eq. 7) with the alpha = beta line
    preference_density.png   the Beta preference density over pass rate (eq. 5) at a few steps
    budget_vs_pass_rate.png  B_i against p_i over the steps that saw pass rates, with the mean per bin
    zero_signal.png          the share of groups and rollouts with identical rewards (zero advantage)

    python plots.py runs/default          # -> runs/default/plots/*.png

And one figure of the method itself, from coba.py alone (no run): the README's picture.
    method_figure            eq. 5's density at the (alpha_t, beta_t) that eqs. 6-7 give for a falling
                             F_bar: the peak moves from easy prompts (high p) to hard ones (low p)

    python plots.py --method-figure docs/beta_by_failure_rate.png

And one of the mechanism over every committed sweep (docs/results.md):
    mechanism_figure         held-out gain against prompts carrying signal per step, a point a run

    python plots.py --mechanism-figure docs/gain_vs_signal_prompts.png

matplotlib with the Agg backend (files only; no display on CI), imported only when drawing, so
`import plots` costs nothing. Test: tests/test_watch.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from harness.paths import check_no_links, check_path

PASS_BINS = np.linspace(0, 1, 11)  # pass-rate bins of the budget-vs-pass-rate figures
EVAL_META = ("type", "step", "rollouts")  # eval record keys that are not an accuracy


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    plt = _plt()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    # no "Software: Matplotlib version ..." text chunk: a redraw under another matplotlib release that
    # draws the same pixels writes the same bytes (Agg PNGs hold no date)
    fig.savefig(tmp, dpi=110, format="png", metadata={"Software": None})
    plt.close(fig)
    os.replace(tmp, path)  # whole or not at all, like the other results files
    return path


def read_run(run_dir: Path) -> list[dict]:
    """A run directory's JSONL records (checkpoint.read_log: a torn last line is dropped)."""
    from engines.checkpoint import read_log

    path = Path(run_dir) / "log.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} not found: pass a run directory (train.py --output-dir)")
    return read_log(path)


def budget_by_pass_rate(train: list[dict]) -> list[float | None]:
    """Mean B_i per pass-rate bin (10 bins on [0, 1]) over the steps whose allocation saw pass rates."""
    steps = [r for r in train if r["seen"] > 0]
    if not steps:
        return [None] * 10
    p = np.concatenate([r["pass_rates"] for r in steps])
    b = np.concatenate([r["budgets"] for r in steps])
    which = np.clip(np.digitize(p, PASS_BINS) - 1, 0, 9)
    return [float(b[which == j].mean()) if np.any(which == j) else None for j in range(10)]


def _bin_line(ax, means: list[float | None], **kw) -> None:
    """Mean B_i per pass-rate bin as a line at the bin centres (a gap where a bin is empty)."""
    centers = (PASS_BINS[:-1] + PASS_BINS[1:]) / 2
    ax.plot(centers, [np.nan if v is None else v for v in means], "-o", ms=2.5, **kw)


def accuracy_keys(evals: list[dict]) -> list[str]:
    """Every accuracy an eval record holds, in first-seen order (heldout_acc, heldout_avg@8, ...)."""
    keys = {}
    for r in evals:
        for k, v in r.items():
            if k not in EVAL_META and isinstance(v, (int, float)):
                keys[k] = True
    return list(keys)


# ----------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------
def accuracy_reward(path: Path, evals: list[dict], train: list[dict]) -> Path:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key in accuracy_keys(evals):
        pts = [(r["rollouts"], r[key]) for r in evals if r.get(key) is not None]
        ax1.plot(*zip(*pts), "-o", ms=3, label=key)
    ax1.set(xlabel="rollouts consumed", ylabel="held-out accuracy", title="Evaluation")
    if evals:
        ax1.legend(fontsize=8)
    x = [r["rollouts"] for r in train]
    reward = np.array([r["reward"] for r in train])
    ax2.plot(x, reward, alpha=0.35, label="per step")
    w = min(10, len(reward))
    if w > 1:  # trailing mean: the per-step reward is noisy
        ax2.plot(x[w - 1:], np.convolve(reward, np.ones(w) / w, "valid"), label=f"mean of {w} steps")
    ax2.set(xlabel="rollouts consumed", ylabel="mean reward of the step's rollouts", title="Training reward")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def capability(path: Path, train: list[dict]) -> Path:
    plt = _plt()
    steps = [r["step"] for r in train]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(steps, [r["F_t"] for r in train], alpha=0.5, label="F_t (eq. 4)")
    ax1.plot(steps, [r["F_bar"] for r in train], label="F_bar (moving average)")
    ax1.axhline(0.5, color="k", lw=0.8, ls="--", label="0.5: eq. 6 switches branch")
    ax1.set(xlabel="step", ylabel="global failure rate", ylim=(-0.02, 1.02), title="Capability signal")
    ax1.legend(fontsize=8)
    ax2.plot(steps, [r["alpha_t"] for r in train], label="alpha_t")
    ax2.plot(steps, [r["beta_t"] for r in train], label="beta_t")
    kappa = train[0]["alpha_t"] + train[0]["beta_t"] if train else 0.0
    ax2.axhline(kappa / 2, color="k", lw=0.8, ls="--", label=f"alpha = beta = kappa/2 = {kappa / 2:g}")
    ax2.set(xlabel="step", ylabel="Beta shape (eq. 7)", title="alpha_t > beta_t: budget to easy prompts")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def preference_densities(path: Path, train: list[dict], how_many: int = 4) -> Path:
    """Eq. 5 at a few steps spread over the run (first, ..., last)."""
    import coba

    plt = _plt()
    p = np.linspace(0.005, 0.995, 199)
    picks = sorted({round(j * (len(train) - 1) / max(how_many - 1, 1)) for j in range(how_many)}) if train else []
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for j in picks:
        r = train[j]
        ax.plot(p, coba.preference_density(p, r["alpha_t"], r["beta_t"]),
                label=f"step {r['step']}: alpha {r['alpha_t']:.2f}, beta {r['beta_t']:.2f}")
    ax.set(xlabel="pass rate p", ylabel="Beta density (eq. 5)", title="Where the value function looks")
    ax.legend(fontsize=8)
    return _save(fig, path)


def budget_vs_pass_rate(path: Path, train: list[dict]) -> Path:
    plt = _plt()
    steps = [r for r in train if r["seen"] > 0]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    if steps:
        p = np.concatenate([r["pass_rates"] for r in steps])
        b = np.concatenate([r["budgets"] for r in steps])
        when = np.concatenate([[r["step"]] * len(r["budgets"]) for r in steps])
        jitter = (np.arange(len(b)) % 7 - 3) * 0.06  # integer budgets: spread the dots a little
        sc = ax.scatter(p, b + jitter, c=when, s=5, alpha=0.4, cmap="viridis")
        fig.colorbar(sc, ax=ax, label="step")
        _bin_line(ax, budget_by_pass_rate(train), color="k", label="mean B_i per bin")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no step saw pass rates yet\n(the first pass over the pool)", ha="center",
                transform=ax.transAxes)
    ax.set(xlabel="pass rate p_i (as the allocator saw it)", ylabel="budget B_i",
           title="Where the budget goes")
    return _save(fig, path)


def zero_signal(path: Path, train: list[dict]) -> Path:
    plt = _plt()
    steps = [r["step"] for r in train]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(steps, [r["frac_reward_zero_std"] for r in train], label="groups")
    ax.plot(steps, [r["zero_signal_rollouts"] / max(sum(r["budgets"]), 1) for r in train], label="rollouts")
    ax.set(xlabel="step", ylabel="share with identical rewards", ylim=(-0.02, 1.02),
           title="Zero-signal groups (no gradient)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_run(run_dir) -> list[Path]:
    """All of a run's figures into RUN_DIR/plots/, from its log alone; returns the PNG paths."""
    run_dir = Path(run_dir)
    log = read_run(run_dir)
    train = [r for r in log if r.get("type") == "train"]
    evals = [r for r in log if r.get("type") == "eval"]
    if not train and not evals:
        raise SystemExit(f"error: {run_dir / 'log.jsonl'} has no train or eval records yet: nothing to plot")
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    paths = [accuracy_reward(out / "accuracy_reward.png", evals, train)]
    if train:
        paths += [capability(out / "capability.png", train),
                  preference_densities(out / "preference_density.png", train),
                  budget_vs_pass_rate(out / "budget_vs_pass_rate.png", train),
                  zero_signal(out / "zero_signal.png", train)]
    return paths


# ----------------------------------------------------------------------------------------------
# The comparison (compare.py): arms at an equal rollout budget, paired over seeds
# ----------------------------------------------------------------------------------------------
# `runs` are compare.summarise_run's per-run dicts (arm, seed, rollouts, acc, alpha_t, F_t,
# budget_by_pass_rate, zero-signal shares); colors maps each arm to one colour in every figure.
def _band(ys: np.ndarray, t975):
    """Mean and 95% t band over seeds of (S, E) curves: (E,) each. t975(df) is the t quantile the
    tables use (compare.py passes its own, so figures and tables agree and this module imports
    nothing above it)."""
    n = len(ys)
    m = ys.mean(0)
    h = t975(n - 1) * ys.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros_like(m)
    return m, m - h, m + h


def accuracy_bands(path: Path, runs: list[dict], colors: dict, t975, name: str = "greedy accuracy") -> Path:
    """Held-out accuracy (`name`: the table's primary metric) vs rollouts consumed: mean over seeds,
    95% CI band."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for arm in colors:
        mine = [r for r in runs if r["arm"] == arm]
        E = min(len(r["acc"]) for r in mine)
        m, lo, hi = _band(np.array([r["acc"][:E] for r in mine]), t975)
        x = np.array(mine[0]["rollouts"][:E])
        ax.plot(x, m, label=f"{arm} (n={len(mine)})", color=colors[arm])
        ax.fill_between(x, lo, hi, alpha=0.12, color=colors[arm])
    ax.set(xlabel="rollouts consumed", ylabel=f"held-out {name}",
           title=f"Equal rollout budget: {name} vs rollouts (mean, 95% CI over seeds)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def difference_bands(path: Path, runs: list[dict], colors: dict, t975, baseline: str = "uniform",
                     name: str = "accuracy") -> Path | None:
    """Paired difference from the baseline along training (same seed), 95% CI band."""
    base = {r["seed"]: r for r in runs if r["arm"] == baseline}
    if not base:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for arm in colors:
        mine = [r for r in runs if r["arm"] == arm and r["seed"] in base and arm != baseline]
        if not mine:
            continue
        E = min(min(len(r["acc"]), len(base[r["seed"]]["acc"])) for r in mine)
        d = np.array([np.array(r["acc"][:E]) - np.array(base[r["seed"]]["acc"][:E]) for r in mine])
        m, lo, hi = _band(d, t975)
        x = np.array(mine[0]["rollouts"][:E])
        ax.plot(x, m, label=arm, color=colors[arm])
        ax.fill_between(x, lo, hi, alpha=0.12, color=colors[arm])
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="rollouts consumed", ylabel=f"{name} - {baseline} (same seed)",
           title=f"Paired difference from {baseline} GRPO in {name} (mean, 95% CI)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def budget_panels(path: Path, runs: list[dict], colors: dict, skip: str = "uniform") -> Path | None:
    """Budget vs pass rate, one panel per arm, one line per seed (the run figure's bin line)."""
    shown = [a for a in colors if a != skip and not a.startswith(f"{skip}:")]  # uniform:M..xG..: B_i = G, nothing to show
    if not shown:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(shown), figsize=(2.6 * len(shown) + 1, 3.2), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], shown):
        for r in (r for r in runs if r["arm"] == arm):
            _bin_line(ax, r["budget_by_pass_rate"], alpha=0.6, color=colors[arm])
        ax.set(title=arm, xlabel="pass rate p_i")
        ax.title.set_fontsize(9)
    axes[0][0].set_ylabel("mean budget B_i (one line per seed)")
    fig.suptitle("Where the budget goes: mean B_i per pass-rate bin")
    return _save(fig, path)


def alpha_failure(path: Path, runs: list[dict], colors: dict) -> Path | None:
    """alpha_t of each CoBA arm and F_t of the first (seed means) over training."""
    coba_arms = [a for a in colors if a.startswith("coba")]
    if not coba_arms:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in coba_arms:
        mine = [r for r in runs if r["arm"] == arm]
        S = min(len(r["alpha_t"]) for r in mine)
        ax.plot(np.arange(1, S + 1), np.mean([r["alpha_t"][:S] for r in mine], 0), color=colors[arm],
                label=f"alpha_t {arm}")
    ax.set(xlabel="step", ylabel="alpha_t (eq. 7; beta_t = kappa - alpha_t)")
    ax2 = ax.twinx()
    mine = [r for r in runs if r["arm"] == coba_arms[0]]
    S = min(len(r["F_t"]) for r in mine)
    ax2.plot(np.arange(1, S + 1), np.mean([r["F_t"][:S] for r in mine], 0), color="k", alpha=0.4,
             label=f"F_t (eq. 4), {coba_arms[0]}")
    ax2.set_ylabel("global failure rate F_t")
    ax.legend(loc="lower left", fontsize=7)
    ax2.legend(loc="lower right", fontsize=7)
    ax.set_title("CoBA's capability signal (mean over seeds)")
    return _save(fig, path)


def zero_signal_bars(path: Path, runs: list[dict], colors: dict) -> Path:
    """Share of zero-signal groups and rollouts (all rewards in the group equal: no gradient) per arm."""
    plt = _plt()
    arms = list(colors)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = np.arange(len(arms))
    for key, off, name in (("zero_signal_group_share", -0.2, "groups"), ("zero_signal_rollout_share", 0.2, "rollouts")):
        vals = [[r[key] for r in runs if r["arm"] == a] for a in arms]
        ax.bar(xs + off, [np.mean(v) for v in vals], 0.4, yerr=[np.std(v) for v in vals], label=name)
    ax.set_xticks(xs, arms, rotation=20, fontsize=8)
    ax.set(ylabel="share with zero advantage", title="Zero-signal groups and rollouts")
    ax.legend()
    return _save(fig, path)


def depth_breadth(path: Path, runs: list[dict], t975, name: str) -> Path | None:
    """compare.py --preset breadth-depth: final held-out accuracy against M at one B_total =
    M x G, whole set and hardest level, mean and 95% CI over seeds. Rising with M: this lab rewards
    distinct prompts over rollouts per prompt. None unless every arm is a uniform:M<m>xG<g> arm."""
    import re

    shape = {r["arm"]: re.fullmatch(r"uniform:M(\d+)xG(\d+)", r["arm"]) for r in runs}
    if not runs or not all(shape.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    arms = sorted(shape, key=lambda a: int(shape[a].group(1)))
    M = [int(shape[a].group(1)) for a in arms]
    for key, label in (("final_acc", "whole held-out set"), ("final_hard", "hardest level")):
        if not all(r.get(key) is not None for r in runs):
            continue
        vals = [np.array([[r[key]] for r in runs if r["arm"] == a]) for a in arms]  # (seeds, 1) per arm
        bands = [_band(v, t975) for v in vals]
        ax.errorbar(M, [b[0][0] for b in bands], yerr=[[b[0][0] - b[1][0] for b in bands],
                                                       [b[2][0] - b[0][0] for b in bands]],
                    marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(M, [f"M {m}\nG {int(shape[a].group(2))}" for m, a in zip(M, arms)])
    ax.set(ylabel=f"final held-out {name}", title="Uniform GRPO at one B_total: depth (left) or breadth (right)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_comparison(out: Path, runs: list[dict], t975, metric: str = "greedy", baseline: str = "uniform") -> list[Path]:
    """compare.py's figures into OUT: accuracy_vs_rollouts.png, difference_vs_uniform.png,
    budget_vs_pass_rate.png, alpha_beta_failure.png, zero_signal.png (those that apply). The runs'
    "acc" curves hold the table's primary metric (compare.table_view): avg@k, else greedy.
    t975(df): the 97.5% Student t quantile for the CI bands (compare.py's)."""
    name = "greedy accuracy" if metric == "greedy" else metric
    plt = _plt()
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    colors = {a: plt.get_cmap("tab10")(i) for i, a in enumerate(arms)}
    out = Path(out)
    paths = [accuracy_bands(out / "accuracy_vs_rollouts.png", runs, colors, t975, name),
             difference_bands(out / f"difference_vs_{'uniform' if baseline == 'uniform' else 'baseline'}.png", runs,
                              colors, t975, baseline=baseline, name=name),
             budget_panels(out / "budget_vs_pass_rate.png", runs, colors),
             depth_breadth(out / "accuracy_vs_prompts_per_step.png", runs, t975, name),
             alpha_failure(out / "alpha_beta_failure.png", runs, colors),
             zero_signal_bars(out / "zero_signal.png", runs, colors)]
    return [p for p in paths if p is not None]


# ----------------------------------------------------------------------------------------------
# The method, from coba.py alone
# ----------------------------------------------------------------------------------------------
METHOD_F_BARS = (0.95, 0.8, 0.6, 0.5, 0.4, 0.3)  # falling failure rate: a model getting better


def method_figure(path: Path, f_bars=METHOD_F_BARS, kappa: float = 11.0, gamma: float = 10.0) -> Path:
    """Eq. 5's Beta density at the (alpha_t, beta_t) of eqs. 6-7 for each F_bar in `f_bars`, with
    the paper's kappa = 11 and gamma = 10. Above F_bar = 0.5 eq. 6 is the identity and the peak sits
    at easy prompts (exploit); below, its sigmoid branch pushes alpha_t down fast (0.3 -> F_tilde
    0.119 -> alpha_t 2.07) and the peak moves to hard prompts (explore)."""
    import coba

    plt = _plt()
    p = np.linspace(0.005, 0.995, 199)  # (199,) open interval: the density may be infinite at 0 or 1
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    cmap = plt.get_cmap("coolwarm")
    for j, F_bar in enumerate(f_bars):
        F_tilde = coba.transform_failure_rate(F_bar, gamma)
        alpha_t, beta_t = coba.beta_params(F_tilde, kappa)
        ax.plot(p, coba.preference_density(p, alpha_t, beta_t), color=cmap(1 - j / max(len(f_bars) - 1, 1)),
                label=f"F_bar {F_bar:.2f}: alpha_t {alpha_t:.2f}, beta_t {beta_t:.2f}")
    ax.set(xlabel="pass rate p of a prompt (hard <- -> easy)", ylabel="Beta density (eq. 5)",
           title="Where CoBA-RL spends rollouts as the failure rate F_bar falls")
    ax.legend(fontsize=7.5, loc="upper center")  # "best" is slow with 199-point curves
    return _save(fig, Path(path))


# ----------------------------------------------------------------------------------------------
# The mechanism, over every committed sweep
# ----------------------------------------------------------------------------------------------
def committed_runs(results: Path) -> list[dict]:
    """Every run summary in RESULTS/**/runs.jsonl that has a signal count, in every table that holds
    it (once_each keeps one of each), with its lab (the sweep's --model, from compare.jsonl) and its
    table's folder."""
    runs = []
    for path in sorted(Path(results).rglob("runs.jsonl")):
        config = {}
        head = path.with_name("compare.jsonl")
        if head.exists() and head.read_text().strip():
            config = json.loads(head.read_text().splitlines()[0])
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") == "run" and r.get("signal_prompts") is not None:
                runs.append({**r, "lab": config.get("model", "toy"), "table": str(path.parent.relative_to(results))})
    return runs


def once_each(runs: list[dict]) -> list[dict]:
    """Each run once, in its first table: a run reused by two tables (e.g. uniform in a headline and
    its ablation) has the same lab, arm, rollouts and curve in both."""
    seen, unique = set(), []
    for r in runs:
        key = (r["lab"], r["arm"], tuple(r["rollouts"]), tuple(r["acc"]))
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def mechanism_figure(results: Path, path: Path) -> tuple[Path, list[str]]:
    """One point a run: its held-out gain (final - start of its primary metric, avg@k) against the
    prompts carrying signal per step (stats.signal_prompts: effective number of groups with a
    non-zero advantage), coloured by arm, one panel per lab. If the ordering of the arms comes from
    how many prompts carry the gradient, each panel's points fall on one rising band whatever the
    arm. Returns the path and a line per lab with the rank correlation (Spearman) of the two."""
    plt = _plt()
    every = committed_runs(results)  # read once: the pooled panels count a run once, the sweeps each
    runs = once_each(every)
    if not runs:
        raise SystemExit(f"error: no run summaries with a signal count under {results}: pass the results folder")
    labs = sorted({r["lab"] for r in runs}, key=lambda lab: (lab != "toy-reason", lab))
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    cmap = plt.get_cmap("tab20")  # its dark shades first, then the light ones: neighbours in `arms` stay apart
    color = {arm: cmap((2 * i) % 20 + (2 * i // 20) % 2) for i, arm in enumerate(arms)}
    markers = "osD^vP*Xh<>"
    fig, axes = plt.subplots(1, len(labs), figsize=(4.6 * len(labs), 4.2), squeeze=False)
    lines = []
    for ax, lab in zip(axes[0], labs):
        mine = [r for r in runs if r["lab"] == lab]
        x = np.array([r["signal_prompts"] for r in mine])
        y = np.array([r["final_acc"] - r["start_acc"] for r in mine])
        tables = list(dict.fromkeys(r["table"] for r in mine))  # a marker per sweep (its regime)
        for arm in dict.fromkeys(r["arm"] for r in mine):
            for t, table in enumerate(tables):
                pick = [i for i, r in enumerate(mine) if r["arm"] == arm and r["table"] == table]
                if pick:
                    ax.scatter(x[pick], y[pick], s=16, color=color[arm], marker=markers[t % len(markers)],
                               label=arm if t == min(tables.index(r["table"]) for r in mine if r["arm"] == arm)
                               else None, alpha=0.85)
        for t, table in enumerate(tables):  # the markers' key, in black
            ax.scatter([], [], color="black", marker=markers[t % len(markers)], s=16, label=table)
        rho = _spearman(x, y)
        ax.set(xlabel="prompts carrying signal per step (effective)", title=f"{lab}: {len(mine)} runs, Spearman {rho:+.2f}")
        lines.append(f"{lab}: {len(mine)} runs from {len({r['table'] for r in mine})} tables, Spearman rho "
                     f"(gain, signal prompts) {rho:+.2f}")
        ax.legend(fontsize=6, loc="best", ncol=2)
    axes[0][0].set_ylabel(f"held-out gain, final - start ({runs[0].get('metric', 'avg@k')})")
    return _save(fig, Path(path)), lines + per_table_lines(every)


def per_table_lines(runs: list[dict]) -> list[str]:
    """The same rank correlation within each sweep of a lab that has several (3 runs or more), over
    committed_runs (a run in every table that holds it): one sweep is one regime, and pooling regimes (other M, steps, lr) can
    make a band or hide one."""
    lines = []
    for lab in dict.fromkeys(r["lab"] for r in runs):
        tables = list(dict.fromkeys(r["table"] for r in runs if r["lab"] == lab))
        for table in tables if len(tables) > 1 else []:
            mine = [r for r in runs if r["lab"] == lab and r["table"] == table]
            if len(mine) >= 3:
                rho = _spearman(np.array([r["signal_prompts"] for r in mine]),
                                np.array([r["final_acc"] - r["start_acc"] for r in mine]))
                lines.append(f"  {lab}, {table}: {len(mine)} runs, Spearman rho {rho:+.2f}")
    return lines


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation (scipy's; ties get their mean rank); nan for fewer than 3 points."""
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic) if len(x) >= 3 else float("nan")


def learning_summary(runs: list[dict], arm: str) -> list[str]:
    """The real-LM lab's learning, one arm's seeds (runs.jsonl rows): held-out avg@k at each evaluation
    (mean over seeds, with each evaluation's own standard error over problems averaged), the gain
    final - start with its 95% t interval over seeds, and, where logged, the format split at the start
    and the end: how often samples were just the number, and how often right when they were."""
    from harness.stats import paired_t

    mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
    if not mine:
        return [f"{arm}: no runs"]
    k = mine[0].get("pass_k")
    acc = np.array([r["acc"] for r in mine])  # (seeds, evaluations)
    se = np.array([r.get("avg_se") or [float("nan")] * acc.shape[1] for r in mine], float)
    lines = [f"{arm}, {len(mine)} seeds ({', '.join(str(r['seed']) for r in mine)}): held-out avg@{k} by rollouts"]
    for j, x in enumerate(mine[0]["rollouts"]):
        lines.append(f"  {x:>6.0f} rollouts: {acc[:, j].mean():.3f} (seeds {', '.join(f'{a:.3f}' for a in acc[:, j])};"
                     f" one evaluation's SE {np.nanmean(se[:, j]):.3f})")
    gain = paired_t(acc[:, -1] - acc[:, 0])
    lines.append(f"  gain final - start: {gain['mean']:+.3f} [95% CI {gain['lo']:+.3f}, {gain['hi']:+.3f}] over "
                 f"{gain['n']} seeds")
    if all("format" in r for r in mine):
        fmt, right = np.array([r["format"] for r in mine]), np.array([r["acc_in_format"] for r in mine])
        lines.append(f"  in the asked format (just the number): {fmt[:, 0].mean():.3f} -> {fmt[:, -1].mean():.3f};"
                     f" right when in it: {right[:, 0].mean():.3f} -> {right[:, -1].mean():.3f}")
    return lines


def learning_figure(path: Path, runs: list[dict]) -> Path:
    """Held-out avg@k against rollouts, a line per seed and arm (left), and the share of samples in the
    asked format (right, where logged): the real-LM lab's figure (README)."""
    plt = _plt()
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    colors = {arm: f"C{i}" for i, arm in enumerate(arms)}
    with_format = all("format" in r for r in runs)
    fig, axes = plt.subplots(1, 2 if with_format else 1, figsize=(10 if with_format else 5.5, 4), squeeze=False)
    for r in sorted(runs, key=lambda r: (arms.index(r["arm"]), r["seed"])):
        k = r.get("pass_k")
        first = r["seed"] == min(q["seed"] for q in runs if q["arm"] == r["arm"])
        axes[0, 0].plot(r["rollouts"], r["acc"], "o-", color=colors[r["arm"]], alpha=0.8, ms=3,
                        label=r["arm"] if first else None)
        if with_format:
            axes[0, 1].plot(r["rollouts"], r["format"], "o--", color=colors[r["arm"]], alpha=0.8, ms=3,
                            label=r["arm"] if first else None)
    axes[0, 0].set(xlabel="training rollouts", ylabel=f"held-out avg@{k}", title="accuracy, a line per seed")
    axes[0, 0].legend()
    if with_format:
        axes[0, 1].set(xlabel="training rollouts", ylabel=f"share of the {k} samples", ylim=(0, 1),
                       title="in the asked format (just the number)")
        axes[0, 1].legend()
    return _save(fig, path)


def plot_run_safely(run_dir) -> list[Path]:
    """train.py's end-of-run call: the run is finished and saved by now, so a figure that fails is
    reported in one line, not raised (`python plots.py RUN_DIR` redoes them)."""
    try:
        return plot_run(run_dir)
    except Exception as e:  # noqa: BLE001 - a plotting bug must not turn a finished run into a crash
        print(f"warning: plots for {run_dir} failed ({type(e).__name__}: {e}); retry with "
              f"python plots.py {run_dir}", file=sys.stderr)
        return []


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description="Draw a run's figures into RUN_DIR/plots/ from RUN_DIR/log.jsonl.")
    ap.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="train.py --output-dir directories")
    ap.add_argument("--method-figure", metavar="PATH", default=None,
                    help="also draw eq. 5's density for a falling F_bar (eqs. 6-7) into PATH, from coba.py "
                         "alone: the README's picture (docs/beta_by_failure_rate.png)")
    ap.add_argument("--mechanism-figure", metavar="PATH", default=None,
                    help="draw held-out gain against prompts carrying signal per step, one point per committed "
                         "run of every sweep under --results, into PATH")
    ap.add_argument("--results", default="results", help="where --mechanism-figure finds the sweeps' runs.jsonl")
    ap.add_argument("--learning", metavar="TABLE_DIR", default=None,
                    help="a compare.py table directory (its runs.jsonl): print each arm's held-out curve, its gain "
                         "with a 95%% CI over seeds and the format split, and draw TABLE_DIR/learning.png "
                         "(the real-LM lab: results/real-lm-smollm2-arith)")
    args = ap.parse_args(argv)
    if not args.run_dirs and args.method_figure is None and args.mechanism_figure is None and args.learning is None:
        ap.error("pass RUN_DIR (a train.py --output-dir), --method-figure PATH, --mechanism-figure PATH or "
                 "--learning TABLE_DIR")
    if args.learning is not None:
        check_path("--learning", args.learning, "dir", exists=True)
        store = Path(args.learning) / "runs.jsonl"
        if not store.is_file():
            ap.error(f"--learning {args.learning}: no runs.jsonl there (compare.py writes it as runs finish)")
        runs = [json.loads(line) for line in store.read_text().splitlines() if line.strip()]
        runs = [r for r in runs if r.get("type") == "run"]
        for arm in dict.fromkeys(r["arm"] for r in runs):
            print(*learning_summary(runs, arm), sep="\n")
        drawn = learning_figure(Path(args.learning) / "learning.png", runs)
        print(f"{drawn}")
        if args.method_figure is None and args.mechanism_figure is None and not args.run_dirs:
            return [drawn]
    if args.mechanism_figure is not None:
        check_path("--mechanism-figure", args.mechanism_figure, "file")
        check_path("--results", args.results, "dir", exists=True)
        drawn, lines = mechanism_figure(Path(args.results), Path(args.mechanism_figure))
        print(f"{drawn}:", *lines, sep="\n")  # a lab a line, then its sweeps one by one
        if args.method_figure is None and not args.run_dirs:
            return [drawn]
    for d in args.run_dirs:  # every directory checked before any figure is drawn (harness/paths.py)
        check_path("RUN_DIR", d, "dir", exists=True)
        check_path("RUN_DIR", str(Path(d) / "plots"), "dir")
        check_no_links("RUN_DIR", Path(d), lambda name: name == "plots")
    if args.method_figure is not None:
        check_path("--method-figure", args.method_figure, "file")
    paths = [method_figure(args.method_figure)] if args.method_figure else []
    if paths:
        print(f"{paths[0]}: eq. 5 at F_bar {', '.join(map(str, METHOD_F_BARS))}")
    for d in args.run_dirs:
        mine = plot_run(d)
        print(f"{d}: {len(mine)} plots in {Path(d) / 'plots'}")
        paths += mine
    return paths


if __name__ == "__main__":
    main()
