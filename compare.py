"""Experiment: CoBA-RL vs uniform GRPO vs Knapsack-RL at an equal rollout budget, paired over seeds.

The paper's central claim (arXiv 2602.03048, §3, Table 1, Figure 6): for the same total rollouts,
capability-oriented allocation learns more. This script reruns that comparison on the offline toy:
every arm gets the same model, data, seeds, prompts per step M and total budget B_total = M*G;
only the split of B_total across prompts differs (and, for the `+probe` arms, our in-step probe).

    python compare.py --preset headline   # the README's headline table (6 arms x 5 seeds)
    python compare.py --preset ablation   # Tables 2-3 of the paper: schedules and fixed (alpha, beta)
    python compare.py --quick             # tiny version (what tests/test_compare.py runs)
    python compare.py --preset full --model toy-strong   # every arm on another starting model
    python compare.py --preset headline --arms uniform coba dapo mopps mopps+coba --model toy-strong
                                          # add the baselines of docs/arms.md to that sweep: the table's
                                          # other arms stay, finished runs (runs/ or runs.jsonl) are reused

Equal rollouts, not equal steps: every arm ends at the same total rollouts, steps x B_total,
on a rollouts axis. DAPO's arm (`dapo`) pays more than B_total for an update (its dropped groups),
so it gets --max-rollouts and --eval-every-rollouts (equal_rollout_flags), makes fewer updates (the
table's "updates" column) and is evaluated at the same rollout counts as the others; the arms that
spend B_total a step keep their flags, so runs made before these arms existed are reused. MoPPS's
arms draw their own prompts (the footer says so); all others share the seed's prompt order.

Design, so that a difference, if there is one, can be seen:
- The regime (`REGIME`): lr 5e-5 and a 512-prompt pool revisited every 16 steps, so uniform GRPO's
  held-out curve is still rising through the ~9 passes over the pool (README: the pilot curves
  that justify it); with `--probe` the allocators differ from step 1.
- Power: 1,024 held-out problems (binomial standard error <= .016) and paired seeds: seed s gives
  every arm the same initial model, the same prompt order and the same held-out set, so arm -
  uniform is compared seed by seed (paired t, 95% CI) and the seed-to-seed noise cancels. The
  table also states the smallest difference the design could detect (80% power, alpha = .05).
  The statistics and the table are harness/stats.py's (compare_arms, markdown_table).
- Resumable: each run lives in OUT/runs/<arm>-seed<s> (its output in train.out); a finished run is
  reused only if its recorded train.py flags are the ones this sweep gives it (else a one-line
  error: another --out, or --redo-mismatched), an interrupted one continues with train.py --resume.
  Ctrl-C or SIGTERM starts no more runs and passes SIGINT to the running ones (they checkpoint and
  exit); a failed run is reported at once with its output's tail and stops the queue the same way
  (harness/sweep.py runs the processes).
  Per-run summaries go to PRESET/runs.jsonl as runs finish, so partial results survive a stop.
- Results files are replaced whole (temp file + rename) and never by fewer runs than they hold:
  runs.jsonl only gains or updates runs; a table that would drop runs is refused. runs.jsonl is
  enough to redo the table and plots (`--plots-only`, e.g. on a fresh checkout without runs/).

Metrics (the paper's metric first). The primary accuracy is held-out avg@k (k = 8 by
`--eval-samples`: k samples per problem at T = 1.0, top-p 0.9, as the paper's avg@16), which sees
learning that greedy accuracy misses (docs/calibration.md); greedy accuracy and pass@k are secondary
columns (final value, and its paired difference from uniform with a 95% CI). On the primary
(docs/calibration.md: "rollouts to reach uniform's final accuracy" is fragile when a curve is noisy, so
there are three): final value; AUC (average over training: the trapezoid area under acc(rollouts)
divided by its span); rollouts to first reach uniform's mean final value, and its ratio to
uniform's on the same seed (geometric mean, CI on the log ratio; "n/a" where uniform starts at or
above its final value). A last column says over how many prompts each step's gradient is spread
(signal_prompts: the effective number of groups with non-zero advantage). The footer states the standard
error of one evaluation over the held-out set (stats.evaluation_noise: avg@k's as harness/evaluate.py logs it).
Runs without avg@k (the first, greedy-only results) are tabled on greedy
accuracy, with a note. Evaluation every 25 steps: avg@8 on 1,024 problems costs ~14 s an evaluation
here, against ~2.3 s a training step (measured; see PRESETS). `--model NAME` runs every arm on
another starting model (runs in OUT/model-NAME/runs, tables in OUT/PRESET-NAME); `--preset full`
holds the headline's and the ablation's arms together.
Writes PRESET/compare.jsonl and PNGs: accuracy_vs_rollouts.png (95% CI bands), difference_vs_uniform.png,
budget_vs_pass_rate.png (one panel per allocator), alpha_beta_failure.png, zero_signal.png (drawn by
plots.py, which also draws each run's own figures).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness import paths
from plots import budget_by_pass_rate, plot_comparison
from harness.stats import (auc, compare_arms, evaluation_noise, markdown_table, oracle_stats,  # paired t, CIs, power,
                   signal_prompts, t_quantile)  # per-run statistics and the table
from harness.sweep import run_queue, sigint_when_parent_dies  # train.py processes, N at a time, stopped cleanly

REPO = Path(__file__).resolve().parent

# Arms: a name and the train.py flags that make it. Everything else is shared (REGIME + preset).
ARMS = {
    "uniform": ["--allocator", "uniform"],
    "knapsack": ["--allocator", "knapsack"],
    "coba": ["--allocator", "coba"],
    "coba-released": ["--allocator", "coba-released"],
    "knapsack+probe": ["--allocator", "knapsack", "--probe"],
    "coba+probe": ["--allocator", "coba", "--probe"],
    # paper Table 2 (schedules) and Table 3 (fixed Beta shapes), all on Algorithm 1
    "coba:explore2exploit": ["--allocator", "coba", "--schedule", "explore2exploit"],
    "coba:linear-decay": ["--allocator", "coba", "--schedule", "linear-decay"],
    "coba:fixed(10.5,1.5)": ["--allocator", "coba", "--schedule", "fixed:10.5,1.5"],
    "coba:fixed(1.5,10.5)": ["--allocator", "coba", "--schedule", "fixed:1.5,10.5"],
    # the published baselines of the same family (docs/arms.md): DAPO's dynamic sampling,
    # MoPPS's prompt selection, and MoPPS choosing the prompts with CoBA splitting the budget
    "dapo": ["--allocator", "uniform", "--dynamic-sampling"],
    "mopps": ["--allocator", "uniform", "--prompt-selection", "mopps"],
    "mopps+coba": ["--allocator", "coba", "--prompt-selection", "mopps"],
    # diagnostics (ours, for analysis, never a method to recommend): the allocator is fed
    # each prompt's current pass rate from K fresh rollouts that are neither trained on nor counted
    "coba-oracle": ["--allocator", "coba", "--pass-rate-source", "oracle"],
    "knapsack-oracle": ["--allocator", "knapsack", "--pass-rate-source", "oracle"],
    # depth or breadth: uniform GRPO at one B_total = M x G = 256, from deep to broad
    **{f"uniform:M{M}xG{256 // M}": ["--allocator", "uniform", "--prompts-per-step", str(M),
                                      "--num-generations", str(256 // M)] for M in (16, 32, 64, 128)},
}
# Flags of an arm that set the step's shape (M, G): placed after the sweep's regime flags too, so the
# arm's value wins (train.py takes an option's last value) where the regime sets the same flag.
SHAPE_FLAGS = ("--prompts-per-step", "--num-generations")


def shape_overrides(arm: str) -> list[str]:
    flags = ARMS[arm]
    return [x for i in range(0, len(flags) - 1) if flags[i] in SHAPE_FLAGS for x in flags[i:i + 2]]
# Equal rollouts, not equal steps: an arm whose update can cost more than B_total rollouts (DAPO's
# refill) gets --max-rollouts = steps x B_total and --eval-every-rollouts = eval_every x B_total, so it
# ends at the same total rollouts as the others, evaluated at the same rollout counts (fewer updates:
# the table says how many). Every other arm spends exactly B_total a step, so for it equal rollouts is
# equal steps and its flags (and its finished runs) stay as they were.
def spends_per_update_vary(arm: str) -> bool:
    return "--dynamic-sampling" in ARMS[arm]


def draws_own_prompts(arm: str) -> bool:
    """MoPPS picks its own prompts: on a seed it does not share the other arms' prompt order."""
    return "mopps" in ARMS[arm]
# The lab regime where allocation can matter (README "Results" shows the pilot).
REGIME = ["--learning-rate", "5e-5", "--train-size", "512", "--eval-size", "1024",
          "--prompts-per-step", "32", "--num-generations", "8", "--save-every", "25"]
# Evaluation every 25 steps (5 points per 100-step run: steps 0, 25, 50, 75, 100). Each point is
# greedy + 8 samples on 1,024 problems = 9,216 generation-only rollouts. Measured on the shared
# 2-core machine (train.py, REGIME, 4 steps, evals at 0, 2, 4; load ~5): the 8 samples
# added 41 s for 3 evaluations (~14 s each) while a training step took ~2.3 s, so 100 steps ~230 s
# train and 5 evaluations ~75 s; every 10 steps (11 evaluations, ~165 s) would cost 3/4 of training.
# toy-reason has its own regime: worked solutions need the lr its calibration found
# stable (3e-4; 5e-5 barely moves it), a 1,024-prompt pool revisited every 32 steps (CoBA needs
# revisits to know pass rates: toy.make_sum_splits), and a step costs ~10x a 3-token step, so its
# runs are shorter and evaluate less often (README: the cost of a step and of an evaluation).
MODEL_REGIMES = {
    "toy-reason": dict(flags=["--learning-rate", "3e-4", "--train-size", "1024", "--eval-size", "1024",
                              "--prompts-per-step", "32", "--num-generations", "8", "--save-every", "10"],
                       steps=40, eval_every=20),
}
# The paper's regime (Table 1, App. C, the released launch script), scaled to these CPUs:
# G = 16 rollouts a prompt on average with B_up = 128, a pool the run passes over 15 times (M 16 over
# 128 prompts: 8 steps an epoch, 120 steps), seven evaluations on the 1,024 held-out problems. The
# learning rate is the one calibrated for it (docs/results.md, "The paper's regime": uniform must not
# fall back over the 120 steps).
PAPER_REGIME_LR = "1e-4"
PAPER_REGIME = ["--learning-rate", PAPER_REGIME_LR, "--train-size", "128", "--eval-size", "1024",
                "--prompts-per-step", "16", "--num-generations", "16", "--max-budget", "128", "--save-every", "10"]
PRESETS = {
    "headline": dict(arms=["uniform", "knapsack", "coba", "coba-released", "knapsack+probe", "coba+probe"],
                     seeds=[0, 1, 2, 3, 4], steps=100, eval_every=25),
    "ablation": dict(arms=["uniform", "coba", "coba:explore2exploit", "coba:linear-decay",
                           "coba:fixed(10.5,1.5)", "coba:fixed(1.5,10.5)"],
                     seeds=[0, 1, 2, 3, 4], steps=100, eval_every=25),
    # both tables' arms in one sweep, e.g. on another starting model: --preset full --model toy-strong
    "full": dict(arms=["uniform", "knapsack", "coba", "coba-released", "knapsack+probe", "coba+probe",
                       "coba:explore2exploit", "coba:linear-decay", "coba:fixed(10.5,1.5)", "coba:fixed(1.5,10.5)"],
                 seeds=[0, 1, 2, 3, 4], steps=100, eval_every=25),
    # uniform GRPO at one B_total = 256 a step, (M, G) from (16, 16) to (128, 2), on toy-reason's regime
    "breadth-depth": dict(arms=[f"uniform:M{M}xG{256 // M}" for M in (16, 32, 64, 128)], seeds=[0, 1, 2, 3, 4],
                          steps=40, eval_every=20, model="toy-reason", baseline="uniform:M16xG16"),  # deepest first
    # the real-LM lab (harness/arith.py: SmolLM2-135M-Instruct, graded arithmetic), at the lab's own preset
    # (M 8 x G 8 = 64 rollouts a step, B in [2, 32], a 64-prompt pool passed over 4 times in 32 steps,
    # 256 held-out problems evaluated every 8 steps); the rule was committed first (docs/results.md).
    # coba first in each seed: its three seeds are also the lab's learning curves (issue 55)
    "real-lm": dict(arms=["coba", "uniform"], seeds=[0, 1, 2], steps=32, eval_every=8, model="smollm2-arith",
                    flags=["--train-size", "64", "--eval-size", "256", "--prompts-per-step", "8",
                           "--num-generations", "8", "--max-completion-length", "10", "--save-every", "4"]),
    # the paper's regime scaled down (PAPER_REGIME), with the oracle diagnostic beside the arms
    "paper-regime": dict(arms=["uniform", "coba", "coba-released", "knapsack", "dapo", "coba-oracle"],
                         seeds=[0, 1, 2, 3, 4], steps=120, eval_every=20, model="toy-reason", flags=PAPER_REGIME),
}
QUICK_FLAGS = ["--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32",
               "--eval-size", "32", "--max-budget", "12"]

# ----------------------------------------------------------------------------------------------
# Runs: one train.py subprocess each (isolated RNG, one torch thread), resumable
# ----------------------------------------------------------------------------------------------
TRAIN = [sys.executable, str(REPO / "train.py")]  # the trainer (tests put a fake one here)
# train.py flags a reused run may have had different from this sweep's: where and how it wrote, and
# speed or memory knobs that leave the numbers alone. Stricter than checkpoint.RESUME_MAY_CHANGE: a reused
# run must have had the same --steps and --eval-every, or its curve is another curve.
MAY_DIFFER = ("output_dir", "resume", "overwrite", "no_progress", "save_every", "threads", "device",
              "micro_batch_size", "generation_batch_size", "gradient_checkpointing",
              "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode")
# train.py flags compare.py sets itself (per arm, per seed, per run dir): not accepted as extra flags
OWN_FLAGS = {"allocator": "--arms", "schedule": "--arms", "probe": "--arms", "seed": "--seeds",
             "dynamic_sampling": "--arms", "prompt_selection": "--arms",
             "max_rollouts": "compare.py's --steps (x B_total, for dapo)",
             "eval_every_rollouts": "compare.py's --eval-every (x B_total, for dapo)",
             "output_dir": "--out", "resume": "(automatic)", "overwrite": "--redo-mismatched",
             "steps": "compare.py's --steps", "eval_every": "compare.py's --eval-every",
             "eval_samples": "compare.py's --eval-samples", "model": "compare.py's --model"}


def run_dir_for(out: Path, arm: str, seed: int) -> Path:
    safe = arm.replace(":", "_").replace("(", "").replace(")", "").replace(",", "_")
    return out / "runs" / f"{safe}-seed{seed}"


def read_log(run_dir: Path) -> list[dict]:
    """The run's JSONL records (checkpoint.read_log: a torn last line of a killed run is dropped)."""
    if not (run_dir / "log.jsonl").exists():
        return []
    from engines import checkpoint  # torch comes with it; only needed once runs exist

    return checkpoint.read_log(run_dir / "log.jsonl")


def is_finished(run_dir: Path) -> bool:
    return any(r.get("type") == "summary" for r in read_log(run_dir))


def train_argv(arm: str, seed: int, extra: list[str]) -> list[str]:
    """The train.py flags that define run (arm, seed) of this sweep (not where it writes)."""
    return [*ARMS[arm], "--seed", str(seed), *extra, *equal_rollout_flags(arm, extra), *shape_overrides(arm)]


def equal_rollout_flags(arm: str, extra: list[str]) -> list[str]:
    """--max-rollouts and --eval-every-rollouts for an arm whose updates cost more than B_total
    (spends_per_update_vary): the sweep's --steps and --eval-every in rollouts, B_total = M x G as
    train.py resolves it from the sweep's flags. [] for every other arm."""
    if not spends_per_update_vary(arm):
        return []
    from harness import cli

    ap = cli.build_parser()
    ap.prog = "compare.py (a flag passed on to train.py)"
    args = cli.resolve_args(ap.parse_args([*ARMS[arm], *extra]), ap)
    return ["--max-rollouts", str(args.steps * args.total_budget),
            "--eval-every-rollouts", str(args.eval_every * args.total_budget)]


def expected_config(flags: list[str]) -> dict:
    """train.py's run_config for these flags, as its log and checkpoints record it (JSON round trip).
    A bad flag is train.py's one-line argparse error, here, before any run starts."""
    from harness import cli
    from engines.checkpoint import run_config

    ap = cli.build_parser()
    ap.prog = "compare.py (a flag passed on to train.py)"
    return json.loads(json.dumps(run_config(cli.resolve_args(ap.parse_args(flags), ap))))


def recorded_config(run_dir: Path) -> dict | None:
    """The flags a run was made with: its newest checkpoint's run_config.json, else (finished runs)
    its log's config line. None when there is nothing to continue: the run starts from scratch."""
    import train

    ckpt = train.find_checkpoint(run_dir) if run_dir.is_dir() else None
    if ckpt is not None and (ckpt / "run_config.json").exists():
        return json.loads((ckpt / "run_config.json").read_text())
    log = read_log(run_dir)
    if any(r.get("type") == "summary" for r in log):
        return next((r for r in log if r.get("type") == "config"), None)
    return None


def config_diffs(recorded: dict, expected: dict, defaults: dict) -> list[str]:
    """`--flag old -> new` for each flag (bar MAY_DIFFER) a run was made with differently. A flag
    the record lacks (an older train.py) counts as its default."""
    diffs = []
    for key in sorted(expected):
        if key in MAY_DIFFER:
            continue
        old = recorded.get(key, defaults.get(key))
        if old != expected[key]:
            diffs.append(f"--{key.replace('_', '-')} {old} -> {expected[key]}")
    return diffs


def user_train_flags(flags: list[str]) -> set:
    """The train.py options named in `flags` (abbreviations resolved by train.py's own parser)."""
    from harness import cli

    ap = cli.build_parser()
    for action in ap._actions:
        action.default = argparse.SUPPRESS
    ap.prog = "compare.py (a flag passed on to train.py)"
    return set(vars(ap.parse_args(flags)))


def mismatched_runs(jobs, out: Path, extra: list[str]) -> dict:
    """(arm, seed) -> differing flags, for each run in OUT/runs (finished, or with a checkpoint to
    continue) that was made with other train.py flags than this sweep would give it."""
    found = {}
    for arm, seed in jobs:
        run_dir = run_dir_for(out, arm, seed)
        if not run_dir.is_dir():
            continue
        recorded = recorded_config(run_dir)
        if recorded is None:
            continue
        from harness import cli

        defaults = json.loads(json.dumps(vars(cli.build_parser().parse_args([]))))
        diffs = config_diffs(recorded, expected_config(train_argv(arm, seed, extra)), defaults)
        if diffs:
            found[(arm, seed)] = diffs
    return found


def stored_runs(jobs, out: Path, extra: list[str], store: dict, old_config: dict, coverage: set) -> dict:
    """(arm, seed) -> differing flags ([] = reusable), for each job with no finished run in OUT/runs
    but a summary in runs.jsonl. The flags it was made with: its own `train_argv` (recorded for
    every run since the comparison arms), else, for a run the table reports, the table's sweep: compare.jsonl's arm flags, the
    seed and its train_flags. A summary with neither is not counted as a run (it is trained)."""
    found = {}
    for arm, seed in jobs:
        if (arm, seed) not in store or is_finished(run_dir_for(out, arm, seed)):
            continue
        made_with = store[(arm, seed)].get("train_argv")
        if made_with is None and (arm, seed) in coverage and arm in old_config.get("arms", {}):
            made_with = [*old_config["arms"][arm], "--seed", str(seed), *old_config.get("train_flags", [])]
        if made_with is None:
            continue
        from harness import cli

        defaults = json.loads(json.dumps(vars(cli.build_parser().parse_args([]))))
        found[(arm, seed)] = config_diffs(expected_config(made_with), expected_config(train_argv(arm, seed, extra)),
                                          defaults)
    return found


def launch(arm: str, seed: int, out: Path, extra: list[str], fresh: bool) -> subprocess.Popen:
    """Start train.py for one run in its own session (so a terminal's Ctrl-C reaches compare.py
    only, which passes it on once), told to stop if compare.py dies (sigint_when_parent_dies).
    Output goes to RUN_DIR/train.out. An interrupted run continues with --resume from its newest
    checkpoint; `fresh` (--redo-mismatched) starts it over."""
    run_dir = run_dir_for(out, arm, seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [*TRAIN, *ARMS[arm], "--seed", str(seed), "--output-dir", str(run_dir), "--no-progress",
           "--threads", "1", *extra, *equal_rollout_flags(arm, extra), *shape_overrides(arm)]  # = train_argv's flags
    has_run = (run_dir / "log.jsonl").exists() or any(run_dir.glob("checkpoint-*"))
    if fresh and has_run:
        cmd.append("--overwrite")  # train.py deletes that run's log and checkpoints, nothing else
    elif has_run:
        cmd.append("--resume")  # from its newest complete checkpoint (none: from scratch)
    # in this process's directory, as every relative path in cmd is meant (--out, a --dataset file): with
    # cwd=REPO a run started outside the repo wrote its log into REPO/OUT/runs, where no one looked
    with (run_dir / "train.out").open("ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=functools.partial(sigint_when_parent_dies, os.getpid()))


# ----------------------------------------------------------------------------------------------
# Results files: written whole (temp file + rename), never replaced by fewer runs than they hold
# ----------------------------------------------------------------------------------------------
def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace `path` in one rename: a crash or Ctrl-C leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(text.encode() if isinstance(text, str) else text)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def load_store(table_dir: Path) -> dict:
    """PRESET/runs.jsonl as (arm, seed) -> per-run summary."""
    return {(r["arm"], r["seed"]): r for r in read_jsonl(table_dir / "runs.jsonl") if r.get("type") == "run"}


def write_store(table_dir: Path, store: dict, first: list) -> None:
    """Write runs.jsonl: the keys in `first` (this sweep's order), then every other run it held.
    A run is only ever replaced by a newer summary of the same (arm, seed), never dropped."""
    order = [k for k in first if k in store] + [k for k in store if k not in first]
    if order:
        write_atomic(table_dir / "runs.jsonl", "".join(json.dumps(store[k]) + "\n" for k in order))


RESULTS_FILES = ("runs.jsonl", "compare.jsonl", "table.md")  # PRESET's results (the PNGs are drawings of them)


def redraw_report(table_dir: Path, before: dict) -> str:
    """--plots-only's line on what it rewrote: the results files whose bytes differ from those it
    replaced (`before`: name -> bytes). Same runs, same code: none. The committed tables are not
    rewritten silently when this code tables them differently from the code that wrote them."""
    changed = [n for n in RESULTS_FILES if n in before and (table_dir / n).read_bytes() != before[n]]
    if not changed:
        return f"redraw: {', '.join(n for n in RESULTS_FILES if n in before)} in {table_dir} byte-identical to before"
    return (f"redraw: {' and '.join(changed)} in {table_dir} changed: this code summarises or tables the runs "
            "differently from the code that wrote them (git diff shows how)")


def table_coverage(table_dir: Path) -> set:
    """The (arm, seed) runs the existing compare.jsonl (and so table.md and the plots) reports."""
    return {(r["arm"], s) for r in read_jsonl(table_dir / "compare.jsonl") if r.get("type") == "summary"
            for s in r.get("seeds", [])}


def table_order(table_dir: Path) -> list[str]:
    """The arms in the order the existing compare.jsonl (and so table.md) lists them; [] without one."""
    return [r["arm"] for r in read_jsonl(table_dir / "compare.jsonl") if r.get("type") == "summary"]


def _pairs(keys) -> str:
    keys = sorted(keys)
    return ", ".join(f"{a} seed {s}" for a, s in keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


# ----------------------------------------------------------------------------------------------
# Per-run metrics
# ----------------------------------------------------------------------------------------------
def summarise_run(arm: str, seed: int, log: list[dict]) -> dict:
    """One run's numbers for runs.jsonl (enough to redo every table and plot). The primary metric
    ("metric") is held-out avg@k (k samples at T = 1.0, top-p 0.9: the paper's avg@16, ours k = 8)
    when the run logged it, else greedy accuracy; "acc", "final_acc", "auc" are the primary's.
    Greedy accuracy and pass@k ride along as secondary metrics."""
    from harness.evaluate import curve, hardest_level  # the eval records, read back (torch comes with it: runs exist)

    config = next((r for r in log if r["type"] == "config"), {})
    evals = [r for r in log if r["type"] == "eval"]
    k = int(config.get("eval_samples") or 0)
    has_avg = k > 0 and bool(evals) and all(f"heldout_avg@{k}" in r for r in evals)
    x, greedy = curve(log, "heldout_acc")
    y = curve(log, f"heldout_avg@{k}")[1] if has_avg else greedy
    train = [r for r in log if r["type"] == "train"]
    # every rollout spent: the batch, or with DAPO every generated group (step_rollouts, step_groups)
    groups = sum(r.get("step_groups", len(r["budgets"])) for r in train)
    rollouts = sum(r.get("step_rollouts", sum(r["budgets"])) for r in train)
    n = config.get("eval_size")
    return {
        "type": "run", "arm": arm, "seed": seed, "metric": f"avg@{k}" if has_avg else "greedy",
        "heldout_n": int(n) if n is not None else None,
        "rollouts": x.tolist(), "acc": y.tolist(),
        "final_acc": float(y[-1]), "start_acc": float(y[0]), "auc": auc(x, y),
        "greedy": greedy.tolist(), "final_greedy": float(greedy[-1]),
        "pass_k": k if has_avg else None,
        "pass": [r[f"heldout_pass@{k}"] for r in evals] if has_avg else None,
        "final_pass": float(evals[-1][f"heldout_pass@{k}"]) if has_avg else None,
        "avg_se": [r.get(f"heldout_avg@{k}_se") for r in evals] if has_avg else None,
        # the real-LM lab's split (harness/arith.py): share of samples in the asked format, right when in it
        **({key: [r[f"heldout_{key}@{k}"] for r in evals] for key in ("format", "acc_in_format")}
           if has_avg and all(f"heldout_format@{k}" in r for r in evals) else {}),
        "zero_signal_group_share": sum(r["zero_signal_groups"] for r in train) / groups,
        "zero_signal_rollout_share": sum(r["zero_signal_rollouts"] for r in train) / rollouts,
        "train_seconds": train[-1]["seconds"], "total_rollouts": train[-1]["rollouts"],
        "max_budget_seen": max(max(r["budgets"], default=0) for r in train),
        "budget_by_pass_rate": budget_by_pass_rate(train),
        "prompts_at_min_budget": float(np.mean([np.mean(np.array(r["budgets"]) == min(r["budgets"]))
                                                for r in train if r["seen"] > 0 and r["budgets"]] or [float("nan")])),
        # updates made (DAPO's arm makes fewer for the same rollouts) and its generation blocks
        "updates": len(train), "blocks": sum(r.get("dapo_blocks", 1) for r in train),
        "alpha_t": [r["alpha_t"] for r in train], "F_t": [r["F_t"] for r in train],
        "signal_prompts": signal_prompts(train),
        **hardest_level(evals, f"avg@{k}" if has_avg else "acc"),
        **oracle_stats(train),
    }


def table_view(runs: list[dict]) -> tuple[list[dict], str, str | None]:
    """The runs as one table sees them: (runs, primary metric, note). All runs share the primary
    metric, or all fall back to greedy accuracy (runs made without --eval-samples, such as the
    greedy-only results committed before avg@k was recorded, or a mix): then "acc" is the greedy curve."""
    metrics = {r.get("metric", "greedy") for r in runs}  # an early runs.jsonl: greedy only
    if len(metrics) == 1 and metrics != {"greedy"}:
        return runs, metrics.pop(), None
    note = ("note: the primary metric (held-out avg@k, --eval-samples) is missing from "
            + ("these runs" if metrics == {"greedy"} else "some of these runs") + ": greedy accuracy instead")
    view = []
    for r in runs:
        if r.get("metric", "greedy") != "greedy":
            g = np.array(r["greedy"])
            r = {**r, "metric": "greedy", "acc": r["greedy"], "final_acc": float(g[-1]), "start_acc": float(g[0]),
                 "auc": auc(np.array(r["rollouts"]), g)}
        view.append({**r, "final_greedy": None, "final_pass": None, "pass_k": None, "final_hard": None})
    return view, "greedy", note


# ----------------------------------------------------------------------------------------------
# The table's footer (the table: stats.markdown_table; the figures: plots.py:plot_comparison)
# ----------------------------------------------------------------------------------------------
def arm_notes(summary: list[dict]) -> list[str]:
    """Footer lines for the comparison arms: which arms end on rollouts after fewer
    updates (DAPO), and which do not share the seed's prompt order (MoPPS draws its own)."""
    lines = []
    fewer = [s for s in summary if s["arm"] in ARMS and spends_per_update_vary(s["arm"]) and "updates_mean" in s]
    if fewer:
        lines.append("Equal rollouts, not equal steps: " + "; ".join(
            f"{s['arm']} ends at the same total rollouts ({s.get('total_rollouts_mean', float('nan')):.0f}) after "
            f"{s['updates_mean']:.1f} updates, {s['blocks_mean'] / max(s['updates_mean'], 1e-9):.2f} "
            "blocks of M x G rollouts each (the dropped groups' rollouts counted)" for s in fewer)
            + "; evaluations fall at the same rollout counts as the other arms'.")
    own = [s["arm"] for s in summary if s["arm"] in ARMS and draws_own_prompts(s["arm"])]
    if own:
        lines.append(f"Prompt order: {', '.join(own)} choose their own prompts (MoPPS's Thompson draws), so on a "
                     "seed they do not share the prompt order of the other arms, which all take the seed's order "
                     "(dapo block by block).")
    return lines


def oracle_notes(runs: list[dict]) -> list[str]:
    """Footer lines for the oracle arms: what their oracle cost, beside the equal rollouts
    (not trained on, not counted), and how stale the tracker's estimate was against it."""
    by = {}
    for r in runs:
        if r.get("oracle_rollouts"):
            by.setdefault(r["arm"], []).append(r)
    lines = []
    for arm, rs in by.items():
        err = [r["stale_error"] for r in rs if r.get("stale_error") is not None]
        lines.append(f"{arm} (a diagnostic, not a method): its oracle drew {np.mean([r['oracle_rollouts'] for r in rs]):.0f} "
                     f"extra rollouts a run ({np.mean([r['oracle_seconds'] for r in rs]):.0f} s of generation), "
                     "neither trained on nor counted in the equal rollouts; "
                     + (f"the last visit's p_i, which coba allocates on, was off the oracle's by {np.mean(err):.3f} on "
                        "average (mean |p_stale - p_oracle| over the prompts seen before)." if err else
                        "no prompt had been seen before, so there is no stale estimate to hold against it."))
    return lines


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 epilog="Unknown flags are passed to every train.py run.")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="headline",
                    help="which table: headline (allocators, probe) or ablation (schedules, fixed Beta)")
    ap.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help="override the preset's arms")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="override the preset's seeds (paired)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (preset: 100; --quick: 6)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="held-out evaluation interval in steps (preset: 25; --quick: 3)")
    ap.add_argument("--eval-samples", type=int, default=8,
                    help="k: the primary metric is held-out avg@k (k samples at T=1.0, top-p 0.9; paper: avg@16); "
                         "greedy accuracy and pass@k are secondary. 0: greedy only")
    ap.add_argument("--model", default=None,
                    help="train.py's --model for every run (e.g. toy-strong; default: the preset's, else toy); runs "
                         "go to OUT/model-NAME/runs and tables to OUT/PRESET-NAME unless it is toy")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel, one torch thread each (2 cores: 2)")
    ap.add_argument("--out", default="results", help="runs/ go here; tables and plots in OUT/PRESET")
    ap.add_argument("--quick", action="store_true", help="tiny, for tests: 2 seeds, 6 steps, small pool")
    ap.add_argument("--plots-only", action="store_true",
                    help="redo tables and plots from finished runs (OUT/runs, else PRESET/runs.jsonl); train nothing")
    ap.add_argument("--measure-power", metavar="TABLE_DIR", default=None,
                    help="train nothing: fit uniform's curve in TABLE_DIR/runs.jsonl and print what the rollouts "
                         "ratio to 80%% of the gain reads for a true 1x, 1.5x, 2x speed-up (stats.measure_power)")
    ap.add_argument("--redo-mismatched", action="store_true",
                    help="runs in OUT/runs made with other train.py flags than this sweep's are trained "
                         "again from scratch (default: refuse)")
    args, train_flags = ap.parse_known_args(argv)
    preset = PRESETS[args.preset]
    args.model = preset.get("model", "toy") if args.model is None else args.model
    args.arms = args.arms or list(preset["arms"])
    args.seeds = args.seeds if args.seeds is not None else ([0, 1] if args.quick else list(preset["seeds"]))
    # explicit values always win (--steps 0 is an error below, never the preset's 100)
    # the steps and evaluations of the preset's own regime (breadth-depth, paper-regime), else the model's, if it has one
    regime = {} if args.quick else preset if "model" in preset else MODEL_REGIMES.get(args.model, {})
    if args.steps is None:
        args.steps = 6 if args.quick else regime.get("steps", preset["steps"])
    if args.eval_every is None:
        args.eval_every = 3 if args.quick else regime.get("eval_every", preset["eval_every"])
    # one-line errors: nothing silently wrong
    if len(set(args.seeds)) != len(args.seeds):
        ap.error(f"--seeds has duplicates ({args.seeds}): each (arm, seed) is one run; pass distinct seeds")
    if len(set(args.arms)) != len(args.arms):
        ap.error(f"--arms has duplicates ({args.arms})")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1 (runs in parallel), got {args.jobs}")
    if args.steps < 1:
        ap.error(f"--steps must be >= 1 (RL steps per run), got {args.steps}")
    if args.eval_samples < 0:
        ap.error(f"--eval-samples must be >= 0 (0: greedy accuracy only), got {args.eval_samples}")
    if args.eval_every < 1:
        ap.error(f"--eval-every must be >= 1 (the curves need evaluations along training), got {args.eval_every}")
    out = paths.check_path("--out", args.out, "dir")  # not empty (Path("") is the current directory), not a file
    paths.check_path("--model", args.model, "name")
    if train_flags and not args.plots_only:
        taken = sorted(user_train_flags(train_flags) & set(OWN_FLAGS))
        if taken:
            ap.error(f"{', '.join('--' + k.replace('_', '-') for k in taken)} would override what compare.py "
                     f"sets for each run: use {', '.join(dict.fromkeys(OWN_FLAGS[k] for k in taken))} instead")
    tag = "" if args.model == "toy" else "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", args.model).strip("_")
    args.table_dir = out / (("quick" if args.quick else args.preset) + tag)
    args.runs_out = out / f"model{tag}" if tag else out  # runs of another model never meet the toy's
    if "flags" in preset and not args.quick:  # a preset with its own regime: its runs never meet the others'
        args.runs_out = out / f"model{tag}-{args.preset}"
    args.regime_flags = (QUICK_FLAGS if args.quick else preset.get("flags")
                         or MODEL_REGIMES.get(args.model, {}).get("flags", REGIME))
    for where in (args.table_dir, args.runs_out / "runs"):  # where tables and runs go: folders too
        paths.check_path("--out", str(where), "dir")
    return args, train_flags


def heldout_size(runs: list[dict], train_flags: list[str]) -> int | None:
    """n, the held-out set's size: from the runs' logs, else the sweep's --eval-size flag."""
    sizes = {r.get("heldout_n") for r in runs} - {None}
    if len(sizes) == 1:
        return sizes.pop()
    last = [i for i, f in enumerate(train_flags[:-1]) if f == "--eval-size"]  # train.py takes the last
    return int(train_flags[last[-1] + 1]) if last and not sizes else None


def prepare_model(args) -> None:
    """Build the toy model once here, not in two runs at a time (other models: the runs load them)."""
    if args.model == "toy":
        import toy

        toy.ensure_toy_model()


def main(argv: list[str] | None = None) -> dict:
    args, train_flags = parse_args(argv)
    if args.measure_power:  # the rollouts measure's power at this table's shape (docs/results.md)
        from harness.stats import calibrate
        power_runs, _, _ = table_view(list(load_store(Path(args.measure_power)).values()))
        if not any(r["arm"] == "uniform" for r in power_runs):
            raise SystemExit(f"error: no uniform runs in {Path(args.measure_power) / 'runs.jsonl'} to fit")
        cal = calibrate(power_runs)
        print(cal["text"])
        return cal
    out = args.runs_out  # OUT, or OUT/model-NAME for another starting model
    extra = [*args.regime_flags, "--steps", str(args.steps), "--eval-every",
             str(args.eval_every), "--eval-samples", str(args.eval_samples), "--model", args.model, *train_flags]
    jobs = [(a, s) for s in args.seeds for a in args.arms]
    table_dir = args.table_dir
    store = load_store(table_dir)  # the per-run summaries already in PRESET/runs.jsonl
    old_config = next(iter(read_jsonl(table_dir / "compare.jsonl")), {})
    coverage = table_coverage(table_dir)
    # Adding arms to a sweep: an arm the table reports and this command does not name is
    # carried over whole from runs.jsonl, neither trained nor dropped; a named arm must keep its seeds.
    carried = sorted(k for k in coverage if k[0] not in args.arms and k in store)
    if carried:
        print(f"keeping {', '.join(dict.fromkeys(a for a, _ in carried))} as {table_dir / 'runs.jsonl'} holds "
              "them (reported by its table, not named by --arms)", flush=True)
    t0 = time.time()
    if args.plots_only:
        # a run's own log if it is here, else its summary in runs.jsonl (committed; runs/ is not)
        have = {k for k in jobs if is_finished(run_dir_for(out, *k))} | (set(jobs) & set(store))
        if not have and not carried:
            raise SystemExit(f"error: nothing to redraw: no finished run of {_pairs(jobs)} in {out / 'runs'} "
                             f"or {table_dir / 'runs.jsonl'}: run the sweep first, or pass the --out/--preset "
                             "that holds it")
        reported = [k for k in jobs if k in have] + carried
        # A redraw lists the arms in the order the table it redraws does, whatever order --arms gives:
        # a plain `--plots-only` takes the preset's arms first, then the carried ones, and so wrote
        # the rows of compare.jsonl and table.md in another order. Arms the table does not
        # report yet come last, in their own order (the sort is stable).
        order = table_order(table_dir)
        reported.sort(key=lambda k: order.index(k[0]) if k[0] in order else len(order))
    else:
        reported = jobs + carried
    dropped = coverage - set(reported)
    if dropped:
        raise SystemExit(f"error: {table_dir}/compare.jsonl and table.md report runs this command would drop "
                         f"({_pairs(dropped)}): pass the same --arms and --seeds, or another --out")
    if not args.plots_only:
        bad = mismatched_runs(jobs, out, extra)
        # a finished run known only by its summary in runs.jsonl (runs/ is not committed) is reused when
        # the flags it was made with are this sweep's; with other flags it is refused like any other
        stored = stored_runs(jobs, out, extra, store, old_config, coverage)
        bad.update({k: diffs for k, diffs in stored.items() if diffs})
        if bad and not args.redo_mismatched:
            flags = sorted({d for diffs in bad.values() for d in diffs})
            raise SystemExit(f"error: {len(bad)} runs in {out / 'runs'} ({_pairs(bad)}) were made with other "
                             f"train.py flags than this sweep gives them ({'; '.join(flags[:6])}): pass another "
                             "--out, or --redo-mismatched to train them again from scratch")
        todo = [k for k in jobs if k in bad or not (is_finished(run_dir_for(out, *k)) or k in stored)]
        table_dir.mkdir(parents=True, exist_ok=True)

        def on_finished(arm, seed):  # per-run summaries go to runs.jsonl as runs finish
            store[(arm, seed)] = {**summarise_run(arm, seed, read_log(run_dir_for(out, arm, seed))),
                                  "train_argv": train_argv(arm, seed, extra)}
            write_store(table_dir, store, jobs)

        if todo:
            prepare_model(args)
            print(f"compare {args.preset}: {len(jobs) - len(todo)} of {len(jobs)} runs finished already; "
                  f"training {len(todo)}, {args.jobs} at a time (Ctrl-C: checkpoint and stop)", flush=True)
            run_queue(todo, lambda arm, seed: launch(arm, seed, out, extra, fresh=(arm, seed) in bad),
                      lambda arm, seed: run_dir_for(out, arm, seed), is_finished, args.jobs, on_finished)
    wall = time.time() - t0
    if args.plots_only:  # keep the sweep's own wall time and flags: a redraw trains nothing
        wall = old_config.get("wall_seconds", 0.0)
    runs = []
    for a, s in reported:
        log = read_log(run_dir_for(out, a, s))
        if any(r.get("type") == "summary" for r in log):
            store[(a, s)] = {**store.get((a, s), {}), **summarise_run(a, s, log)}
        if not args.plots_only and (a, s) in jobs:  # checked against, or made with, this sweep's flags
            store[(a, s)]["train_argv"] = train_argv(a, s, extra)
        runs.append(store[(a, s)])
    before = {p.name: p.read_bytes() for p in map(table_dir.joinpath, RESULTS_FILES) if p.is_file()}
    table_dir.mkdir(parents=True, exist_ok=True)
    # a redraw keeps runs.jsonl's order (its --arms may list the table's arms in another order)
    write_store(table_dir, store, [] if args.plots_only else jobs)
    runs, metric, note = table_view(runs)  # primary metric: avg@k, or greedy for runs without it
    baseline = PRESETS[args.preset].get("baseline", "uniform")  # what every arm is paired against
    summary, diffs = compare_arms(runs, baseline) if any(r["arm"] == baseline for r in runs) else ([], [])
    config = {"type": "config", "preset": args.preset, "argv": sys.argv[1:] if argv is None else argv,
              "train_flags": extra, "arms": {a: ARMS[a] for a in dict.fromkeys([*args.arms, *(a for a, _ in carried)])},
              "seeds": args.seeds,
              "model": args.model, "wall_seconds": round(wall, 1)}
    if args.plots_only and old_config.get("type") == "config" and old_config.get("seeds") == args.seeds:
        # the sweep's record as it was: how a redraw was invoked is no result, and recording it
        # (an earlier "redrawn_by") rewrote a committed line at every redraw. A redraw over
        # other seeds (an interim table grown by a seed) is a new table: it records its own command.
        config = dict(old_config)
    config.update(metric=metric, metric_note=note)
    write_atomic(table_dir / "compare.jsonl", "".join(json.dumps(row) + "\n" for row in [config] + summary + diffs))
    plots = plot_comparison(table_dir, runs, lambda df: t_quantile(0.975, df), metric, baseline)  # plots.py draws
    footer = (evaluation_noise(runs, metric, heldout_size(runs, config["train_flags"])) + ([note] if note else [])
              + arm_notes(summary) + oracle_notes(runs))
    pass_k = next((r["pass_k"] for r in runs if r.get("pass_k")), None)
    hard = next(((r["hard_level"], r["hard_n"]) for r in runs if r.get("hard_level") is not None), None)
    hard_label = f" (level {hard[0]}, n = {hard[1]})" if hard else ""
    table = (markdown_table(summary, diffs, metric, pass_k, footer, hard_label, baseline) if summary
             else f"(no {baseline} runs: no table)")
    write_atomic(table_dir / "table.md", table + "\n")
    print(table)
    if args.plots_only:
        print(redraw_report(table_dir, before))
    missing = len(set(jobs) - {(r["arm"], r["seed"]) for r in runs})  # of this sweep's; carried arms' runs are extra
    print(f"wall time {wall:.0f} s ({len(runs)} finished runs{f', {missing} not found' if missing else ''}); "
          f"wrote {table_dir / 'compare.jsonl'}, table.md and {len(plots)} plots")
    return {"runs": runs, "summary": summary, "paired": diffs, "wall_seconds": wall}


if __name__ == "__main__":
    main()
