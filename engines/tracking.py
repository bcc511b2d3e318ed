"""Watching a run live: TensorBoard or Weights & Biases (`--report-to`, TRL's flag), and sample completions.

The JSONL log (OUTPUT_DIR/log.jsonl) stays the run's record; this file mirrors it to a tracker so a
run can be watched while it trains, under the names TRL's GRPOTrainer uses where one exists
(`train/reward`, `train/frac_reward_zero_std`, ...; TRL_NAMES below), so a CoBA run and a TRL run read
alike on one dashboard. CoBA's own signals (F_t, F_bar, alpha_t, beta_t, tau: paper §2.3, eqs. 4-8)
go under `train/coba/`. Every scalar of a train or eval record is sent at the record's step; the
per-prompt vectors (B_i, p_i, group rewards) go as histograms.

Sample completions (`--log-completions N`, step_completions): each step, N (step, prompt, completion,
reward, B_i, p_i) rows to OUTPUT_DIR/completions.jsonl and to the tracker (a wandb Table; TensorBoard
text). Half come from the prompts given the largest budgets, half from the smallest, so both ends of
the allocation can be read (pick_groups).

Trackers are optional: imported only when asked for; a missing one is a one-line error naming its
install command. wandb runs offline without network or API key (WANDB_MODE=offline; `wandb sync`
later). On --resume the tracker continues the same run: TensorBoard purges the steps after the
checkpoint, wandb resumes the run whose id is kept in OUTPUT_DIR/wandb_id.
Test: tests/test_watch.py.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import secrets
import shutil
from pathlib import Path

import numpy as np

from engines.checkpoint import truncate_log

REPORT_TO = ("none", "tensorboard", "wandb")
INSTALL = {"tensorboard": "pip install tensorboard", "wandb": "pip install wandb"}
COMPLETIONS = "completions.jsonl"
TB_DIR = "tensorboard"  # OUTPUT_DIR/tensorboard: `tensorboard --logdir OUTPUT_DIR`
WANDB_ID = "wandb_id"  # OUTPUT_DIR/wandb_id: the wandb run id, so --resume continues that run
MAX_CHARS = 300  # prompt and completion are cut to this many characters in the sample rows

# Log key -> tracker name, where TRL's GRPOTrainer has a name for the same quantity (TRL logs them
# under train/ and eval/). Our `clip_frac` is the share of completion tokens whose ratio was clipped:
# TRL's clip_ratio. A key not listed goes as train/<key> (eval/<key>); CoBA's own under train/coba/.
TRL_NAMES = {
    "reward": "train/reward",
    "reward_std": "train/reward_std",
    "frac_reward_zero_std": "train/frac_reward_zero_std",
    "completion_length": "train/completions/mean_length",
    "kl": "train/kl",
    "clip_frac": "train/clip_ratio",
    "grad_norm": "train/grad_norm",
    "lr": "train/learning_rate",
    "loss": "train/loss",
    "entropy": "train/entropy",
    # not TRL's num_tokens (cumulative, prompts included): this step's completion tokens, renamed
    "num_tokens": "train/step_num_tokens",
    # CoBA-RL's capability signal and allocation (paper §2.3-2.4)
    "F_t": "train/coba/F_t", "F_bar": "train/coba/F_bar", "alpha_t": "train/coba/alpha_t",
    "beta_t": "train/coba/beta_t", "tau": "train/coba/tau", "seen": "train/coba/seen",
    "zero_signal_groups": "train/coba/zero_signal_groups",
    "zero_signal_rollouts": "train/coba/zero_signal_rollouts",
}
# Per-step vectors (M,) sent as histograms; prompt_idx (dataset indices) is not a distribution.
HISTOGRAMS = {"budgets": "train/coba/budgets", "pass_rates": "train/coba/pass_rates",
              "group_reward": "train/group_reward"}


def tracker_name(kind: str, key: str) -> str:
    """The tracker's name for a scalar of a `train` or `eval` record (TRL_NAMES, else kind/key)."""
    if kind == "train":
        return TRL_NAMES.get(key, f"train/{key}")
    return f"{kind}/{key}"


def scalars(record: dict) -> dict[str, float]:
    """Every finite number of a train or eval record under its tracker name (not `step`)."""
    out = {}
    for key, value in record.items():
        if key in ("type", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[tracker_name(record["type"], key)] = float(value)
    return out


# ----------------------------------------------------------------------------------------------
# Sample completions
# ----------------------------------------------------------------------------------------------
def pick_groups(budgets: list[int], n: int) -> list[int]:
    """Up to n distinct prompts (group indices), alternately the largest and the smallest B_i left,
    so the rows show both what the allocator favoured and what it starved. Deterministic: it must
    not draw from any RNG, or logging would change the run (--resume checks exact continuation)."""
    order = sorted(range(len(budgets)), key=lambda i: (-budgets[i], i))  # largest B_i first
    picked, lo, hi = [], len(order) - 1, 0
    while len(picked) < min(n, len(order)):
        if len(picked) % 2 == 0:
            picked.append(order[hi])
            hi += 1
        else:
            picked.append(order[lo])
            lo -= 1
    return picked


def completion_rows(step: int, prompt_idx, prompts, answers, completion_ids, rewards, budgets, pass_rates,
                    tokenizer, n: int) -> list[dict]:
    """n sample rows of one step: for each picked prompt one completion (a correct one for every
    other row, an incorrect one for the rest, where the group has one), decoded, cut to MAX_CHARS.
    completion_ids and rewards are prompt-major (group i's B_i rows contiguous), as in train.rl_step."""
    starts = np.concatenate([[0], np.cumsum(budgets)[:-1]]).astype(int)  # (M,) first row of each group
    rows = []
    for k, i in enumerate(pick_groups(budgets, n)):
        group = range(starts[i], starts[i] + budgets[i])
        want = 1.0 if k % 2 == 0 else 0.0
        r = next((r for r in group if rewards[r] == want), starts[i])
        text = tokenizer.batch_decode([completion_ids[r]], skip_special_tokens=True)[0]  # as rollout.decode
        rows.append({"step": step, "prompt_idx": int(prompt_idx[i]), "prompt": prompts[i][:MAX_CHARS],
                     "answer": str(answers[i])[:MAX_CHARS], "completion": text[:MAX_CHARS],
                     "reward": float(rewards[r]), "B_i": int(budgets[i]),
                     "p_i": round(float(pass_rates[i]), 4)})  # rounded as in the log's pass_rates
    return rows


def step_completions(step: int, batch, tokenizer, n: int) -> list[dict]:
    """completion_rows of one train.py step (batch: its engines/step_data.StepBatch), from this rank's own groups
    (rank 0 writes; all of them in one process) and their rows of the step's N rewards."""
    roll, share, alloc = batch.roll, batch.share, batch.alloc
    own, rows = share.owned[share.rank], share.rows()
    return completion_rows(step, [roll.prompt_idx[i] for i in own], [roll.prompts[i] for i in own],
                           [roll.answers_m[i] for i in own], batch.completion_ids,
                           [batch.rewards[r] for r in rows.tolist()], [alloc.budgets[i] for i in own],
                           alloc.pass_rates[own], tokenizer, n)


def _markdown(rows: list[dict]) -> str:
    """TensorBoard's text plugin renders markdown: one table row per sample."""
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| B_i | p_i | reward | prompt | completion |", "|---|---|---|---|---|"]
    lines += [f"| {r['B_i']} | {r['p_i']} | {r['reward']:g} | {cell(r['prompt'])} | {cell(r['completion'])} |"
              for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The tracker
# ----------------------------------------------------------------------------------------------
def _require(name: str):
    """Import an optional tracker package, or stop with one line naming its install command."""
    try:
        return __import__(name)
    except ImportError:
        raise SystemExit(f"error: --report-to {name} needs the {name} package: {INSTALL[name]} "
                         "(or --report-to none)")


class Tracker:
    """Mirrors the JSONL log to --report-to's tracker and writes the sample completions.

    log(record): every JSONL record (train.Run.write calls it); log_completions(rows): one step's
    sample rows; close(). start: the step the run starts at (the checkpoint's on --resume), so a
    resumed run continues the same tracker run and completions.jsonl is cut back to it."""

    def __init__(self, report_to: str, out: Path, start: int = 0, config: dict | None = None):
        self.report_to, self.out, self.closed = report_to, Path(out), False
        self.tb = self.wandb = None
        self.completions = self.out / COMPLETIONS
        if start == 0:
            self.completions.write_text("")
        elif self.completions.exists():  # the log's rule: the rows up to the checkpoint's step
            truncate_log(self.completions, start)
        if report_to == "tensorboard":
            self._open_tensorboard(start)
        elif report_to == "wandb":
            self._open_wandb(start, config or {})
        elif report_to != "none":
            raise SystemExit(f"error: --report-to {report_to}: use one of {', '.join(REPORT_TO)}")
        atexit.register(self.close)  # a run stopped by an error or Ctrl-C still closes its files

    def _open_tensorboard(self, start: int) -> None:
        _require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.out / TB_DIR
        if start == 0:  # a fresh run (or --overwrite): the old run's events would mix into the curves
            shutil.rmtree(log_dir, ignore_errors=True)
        # purge_step: TensorBoard drops the events logged after the checkpoint by the interrupted run
        self.tb = SummaryWriter(str(log_dir), purge_step=start + 1 if start else None)

    def _open_wandb(self, start: int, config: dict) -> None:
        wandb = _require("wandb")
        id_path = self.out / WANDB_ID
        if start and id_path.exists():
            run_id = id_path.read_text().strip()
        else:
            run_id = secrets.token_hex(4)  # wandb's own format: 8 lowercase letters and digits
            id_path.write_text(run_id + "\n")
        # No network here (and none on CI): without WANDB_MODE and an API key, log offline instead of
        # prompting for a login; `wandb sync OUTPUT_DIR/wandb/offline-run-*` uploads it later.
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "coba-rl"), name=self.out.name,
                                id=run_id, resume="allow", dir=str(self.out), config=config, mode=mode)
        self._wandb_mod = wandb

    def log(self, record: dict) -> None:
        """One JSONL record: train/eval scalars at its step, histograms of the per-prompt vectors."""
        kind, step = record.get("type"), record.get("step")
        if self.closed or kind not in ("config", "train", "eval"):
            return
        if kind == "config":
            if self.tb is not None:
                self.tb.add_text("config", "```\n" + json.dumps(record, indent=1) + "\n```", 0)
            return
        values = scalars(record)
        if self.tb is not None:
            for name, value in values.items():
                self.tb.add_scalar(name, value, step)
            for key, name in HISTOGRAMS.items():
                if record.get(key):
                    self.tb.add_histogram(name, np.asarray(record[key], dtype=float), step)
            self.tb.flush()  # live: TensorBoard sees each step as it ends; a crash loses nothing
        if self.wandb is not None:
            for key, name in HISTOGRAMS.items():
                if record.get(key):
                    values[name] = self._wandb_mod.Histogram(record[key])
            self.wandb.log(values, step=step)

    def log_completions(self, rows: list[dict]) -> None:
        """One step's sample rows: appended to completions.jsonl, and a table in the tracker."""
        if self.closed or not rows:
            return
        with self.completions.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        step = rows[0]["step"]
        if self.tb is not None:
            self.tb.add_text("completions", _markdown(rows), step)
        if self.wandb is not None:
            cols = list(rows[0])
            table = self._wandb_mod.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])
            self.wandb.log({"completions": table}, step=step)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
