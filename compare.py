"""Experiment: CoBA-RL vs uniform GRPO vs Knapsack-RL at an equal rollout budget, with plots.

The paper's central claim (arXiv 2602.03048, §3, Table 1, Figure 6): for the same total rollouts,
capability-oriented allocation learns more. This script reruns that comparison on the offline toy:
every allocator gets the same model, data, seeds, prompts per step M and total budget B_total = M*G,
and only the split of B_total across prompts differs.

    python compare.py            # 4 allocators x 3 seeds, ~20 min on 2 cores
    python compare.py --quick    # tiny version (what tests/test_compare.py runs)

Writes results/compare.jsonl (one line per run, then one summary line per allocator) and PNGs:
accuracy_vs_rollouts.png, budget_vs_pass_rate.png (the paper's Figure 1 idea: exploit first, then
explore), alpha_beta_failure.png, zero_signal.png. Runs go two at a time (one torch thread each:
two 1-thread runs side by side double throughput on 2 cores, calibration.md).

Metrics (calibration.md: "rollouts to reach uniform's final accuracy" is fragile when a curve peaks
and decays, so we report three): final held-out greedy accuracy; area under the accuracy-vs-rollouts
curve (normalised by its rollout span: the average accuracy over training); rollouts to first reach
uniform GRPO's mean final accuracy (per seed; "never" if not reached).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent
ALLOCATORS = ["uniform", "knapsack", "coba", "coba-released"]


def run_one(allocator: str, seed: int, out: Path, extra: list[str]) -> Path:
    """One training run as a subprocess (isolated RNG, one thread); returns its output dir."""
    run_dir = out / "runs" / f"{allocator}-seed{seed}"
    cmd = [sys.executable, str(REPO / "train.py"), "--allocator", allocator, "--seed", str(seed),
           "--output-dir", str(run_dir), "--no-progress", "--threads", "1", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"run {allocator} seed {seed} failed:\n{proc.stderr[-3000:]}")
    return run_dir


def read_log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]


def curve(log: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(rollouts, held-out greedy accuracy) at each evaluation."""
    evals = [r for r in log if r["type"] == "eval"]
    return np.array([r["rollouts"] for r in evals], float), np.array([r["heldout_acc"] for r in evals])


def auc(x: np.ndarray, y: np.ndarray) -> float:
    """Average accuracy over training: trapezoid area under acc(rollouts) divided by the span."""
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0])) if len(x) > 1 else float(y[-1])


def rollouts_to_reach(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    hit = np.nonzero(y >= target - 1e-12)[0]
    return float(x[hit[0]]) if len(hit) else None


def summarise_run(allocator: str, seed: int, log: list[dict]) -> dict:
    x, y = curve(log)
    train = [r for r in log if r["type"] == "train"]
    groups = sum(len(r["budgets"]) for r in train)
    rollouts = sum(sum(r["budgets"]) for r in train)
    return {
        "type": "run", "allocator": allocator, "seed": seed, "rollouts": x.tolist(), "acc": y.tolist(),
        "final_acc": float(y[-1]), "start_acc": float(y[0]), "auc": auc(x, y),
        "zero_signal_group_share": sum(r["zero_signal_groups"] for r in train) / groups,
        "zero_signal_rollout_share": sum(r["zero_signal_rollouts"] for r in train) / rollouts,
        "train_seconds": train[-1]["seconds"], "total_rollouts": train[-1]["rollouts"],
        "max_budget_seen": max(max(r["budgets"]) for r in train),
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per allocator: mean and std over seeds, and rollouts to reach uniform's mean final accuracy."""
    target = float(np.mean([r["final_acc"] for r in runs if r["allocator"] == "uniform"]))
    rows = []
    for allocator in dict.fromkeys(r["allocator"] for r in runs):
        mine = [r for r in runs if r["allocator"] == allocator]
        reach = [rollouts_to_reach(np.array(r["rollouts"]), np.array(r["acc"]), target) for r in mine]
        got = [v for v in reach if v is not None]
        row = {"type": "summary", "allocator": allocator, "seeds": [r["seed"] for r in mine],
               "uniform_final_acc_target": target, "reached": f"{len(got)}/{len(mine)}",
               "rollouts_to_target_mean": float(np.mean(got)) if got else None,
               "rollouts_to_target_std": float(np.std(got)) if got else None}
        for key in ("final_acc", "auc", "zero_signal_group_share", "zero_signal_rollout_share", "train_seconds"):
            vals = np.array([r[key] for r in mine])
            row[f"{key}_mean"], row[f"{key}_std"] = float(vals.mean()), float(vals.std())
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------
def plot_all(out: Path, runs: list[dict], logs: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI
    import matplotlib.pyplot as plt

    paths = []
    colors = dict(zip(ALLOCATORS, ["tab:gray", "tab:orange", "tab:blue", "tab:green"]))

    # 1. held-out accuracy vs rollouts consumed: mean over seeds, band = min..max
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for allocator in dict.fromkeys(r["allocator"] for r in runs):
        mine = [r for r in runs if r["allocator"] == allocator]
        x = np.array(mine[0]["rollouts"])
        ys = np.array([r["acc"] for r in mine])
        ax.plot(x, ys.mean(0), label=f"{allocator} (n={len(mine)})", color=colors.get(allocator))
        ax.fill_between(x, ys.min(0), ys.max(0), alpha=0.15, color=colors.get(allocator))
    ax.set(xlabel="rollouts consumed", ylabel="held-out greedy accuracy",
           title="Equal rollout budget: accuracy vs rollouts (mean, min-max over seeds)")
    ax.legend()
    paths.append(_save(fig, out / "accuracy_vs_rollouts.png"))

    # 2. budget per prompt vs its pass rate, early / middle / late (Figure 1 idea), first coba seed
    key = next((k for k in logs if k[0] == "coba"), None)
    if key is not None:
        train = [r for r in logs[key] if r["type"] == "train" and r["seen"] > 0]
        if train:
            fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
            thirds = np.array_split(np.arange(len(train)), 3)
            for ax, idx, name in zip(axes, thirds, ["early", "middle", "late"]):
                if len(idx) == 0:  # fewer allocated steps than panels (the --quick run)
                    continue
                p = np.concatenate([train[i]["pass_rates"] for i in idx])
                b = np.concatenate([train[i]["budgets"] for i in idx])
                ax.scatter(p, b, s=6, alpha=0.3)
                bins = np.linspace(0, 1, 11)
                which = np.clip(np.digitize(p, bins) - 1, 0, 9)
                means = [b[which == j].mean() if np.any(which == j) else np.nan for j in range(10)]
                ax.plot((bins[:-1] + bins[1:]) / 2, means, "r-o", ms=3, label="mean B_i")
                a = np.mean([train[i]["alpha_t"] for i in idx])
                ax.set(title=f"{name} steps (mean alpha_t={a:.2f})", xlabel="pass rate p_i (last visit)")
            axes[0].set_ylabel("budget B_i")
            axes[0].legend()
            fig.suptitle(f"CoBA budget vs pass rate, seed {key[1]}")
            paths.append(_save(fig, out / "budget_vs_pass_rate.png"))

        # 3. alpha_t / beta_t and the global failure rate over training
        train = [r for r in logs[key] if r["type"] == "train"]
        fig, ax = plt.subplots(figsize=(6.4, 4))
        steps = [r["step"] for r in train]
        ax.plot(steps, [r["alpha_t"] for r in train], label="alpha_t")
        ax.plot(steps, [r["beta_t"] for r in train], label="beta_t")
        ax.set(xlabel="step", ylabel="Beta shape (eq. 7)")
        ax2 = ax.twinx()
        ax2.plot(steps, [r["F_t"] for r in train], color="k", alpha=0.5, label="F_t (eq. 4)")
        ax2.set_ylabel("global failure rate F_t")
        fig.legend(loc="upper right")
        ax.set_title(f"CoBA capability signal, seed {key[1]}")
        paths.append(_save(fig, out / "alpha_beta_failure.png"))

    # 4. share of zero-signal groups (and of rollouts spent in them) per allocator
    summ = summarise(runs)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    names = [s["allocator"] for s in summ]
    xs = np.arange(len(names))
    ax.bar(xs - 0.2, [s["zero_signal_group_share_mean"] for s in summ], 0.4,
           yerr=[s["zero_signal_group_share_std"] for s in summ], label="groups")
    ax.bar(xs + 0.2, [s["zero_signal_rollout_share_mean"] for s in summ], 0.4,
           yerr=[s["zero_signal_rollout_share_std"] for s in summ], label="rollouts")
    ax.set_xticks(xs, names)
    ax.set(ylabel="share with zero advantage", title="Zero-signal groups (all rewards equal)")
    ax.legend()
    paths.append(_save(fig, out / "zero_signal.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def markdown_table(summary: list[dict]) -> str:
    lines = ["| allocator | final acc | avg acc over training (AUC) | rollouts to reach uniform's final acc "
             "| zero-signal groups | zero-signal rollouts |", "|---|---|---|---|---|---|"]
    for s in summary:
        reach = ("never" if s["rollouts_to_target_mean"] is None else
                 f"{s['rollouts_to_target_mean']:.0f} ± {s['rollouts_to_target_std']:.0f} ({s['reached']} seeds)")
        lines.append(f"| {s['allocator']} | {s['final_acc_mean']:.3f} ± {s['final_acc_std']:.3f} "
                     f"| {s['auc_mean']:.3f} ± {s['auc_std']:.3f} | {reach} "
                     f"| {s['zero_signal_group_share_mean']:.2f} | {s['zero_signal_rollout_share_mean']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--allocators", nargs="+", default=ALLOCATORS, choices=ALLOCATORS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per allocator and seed")
    ap.add_argument("--steps", type=int, default=150, help="RL steps per run")
    ap.add_argument("--eval-every", type=int, default=10, help="held-out evaluation interval (steps)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (one torch thread each)")
    ap.add_argument("--out", default="results", help="where compare.jsonl, plots and runs/ go")
    ap.add_argument("--quick", action="store_true", help="tiny version for tests: 2 allocators... see code")
    args, train_flags = ap.parse_known_args(argv)
    if args.quick:
        args.steps, args.eval_every = 6, 3
        train_flags += ["--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32",
                        "--eval-size", "32", "--max-budget", "12"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--steps", str(args.steps), "--eval-every", str(args.eval_every), *train_flags]
    jobs = [(a, s) for s in args.seeds for a in args.allocators]
    from tqdm.auto import tqdm

    import toy

    toy.ensure_toy_model()  # build once here, not in two runs at a time
    t0 = time.time()
    bar = tqdm(total=len(jobs), desc="compare runs")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, a, s, out, extra): (a, s) for a, s in jobs}
        logs = {}
        for fut in futures:
            logs[futures[fut]] = read_log(fut.result())
            bar.update(1)
    bar.close()
    wall = time.time() - t0
    runs = [summarise_run(a, s, logs[(a, s)]) for a, s in jobs]
    summary = summarise(runs) if any(r["allocator"] == "uniform" for r in runs) else []
    with (out / "compare.jsonl").open("w") as f:
        f.write(json.dumps({"type": "config", "argv": sys.argv[1:] if argv is None else argv,
                            "train_flags": extra, "wall_seconds": round(wall, 1)}) + "\n")
        for row in runs + summary:
            f.write(json.dumps(row) + "\n")
    plots = plot_all(out, runs, logs) if summary else []
    print(markdown_table(summary) if summary else "(no uniform runs: no summary)")
    print(f"wall time {wall:.0f} s; wrote {out / 'compare.jsonl'} and {len(plots)} plots")
    return runs + summary


if __name__ == "__main__":
    main()
