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

matplotlib with the Agg backend (files only; no display on CI), imported only when drawing, so
`import plots` costs nothing. Test: tests/test_watch.py.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_run(run_dir: Path) -> list[dict]:
    """A run directory's JSONL records (checkpoint.read_log: a torn last line is dropped)."""
    from checkpoint import read_log

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
    ap.add_argument("run_dirs", nargs="+", help="train.py --output-dir directories")
    args = ap.parse_args(argv)
    paths = []
    for d in args.run_dirs:
        mine = plot_run(d)
        print(f"{d}: {len(mine)} plots in {Path(d) / 'plots'}")
        paths += mine
    return paths


if __name__ == "__main__":
    main()
