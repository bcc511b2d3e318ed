"""Evaluation the paper's way (arXiv 2602.03048 §3, Table 1): avg@k, pass@k and greedy accuracy on
every eval set, per difficulty level on the labs; one log record each time; --eval-only.

The paper's metric is avg@16: k = 16 samples per problem at T = 1.0, top-p 0.9, and the mean
accuracy over them (ours: k = --eval-samples, 8 on the labs). Beside it we log greedy accuracy (one
greedy completion per problem) and pass@k (any of the k samples right). The benchmarks' plain mean
is Table 1's "Avg." column (eval_mean_avg@k); the held-out split of the training data is no benchmark.

    evaluate         one eval set: greedy, avg@k (+ its standard error), pass@k; per level on the labs
    accuracies       those numbers from the 0/1 outcomes (pure: tests call it directly)
    run_eval         every eval set, one JSONL record, sampled from its own RNG (common random numbers)
    eval_due, evaluate_inside   when a run evaluates: every --eval-every steps or --eval-every-rollouts,
                     and the points that fall inside one update's generation (DAPO's arm)
    final_summary, start_end    the final evaluation and the summary's first and final accuracies
                     (cli.closing_line prints them)
    eval_only        --eval-only: a model or checkpoint directory evaluated without training
    curve, hardest_level   the records read back: a metric against rollouts, the hardest level's curve
                     (compare.py's per-run numbers)

train.py evaluates at step 0, every --eval-every steps (or --eval-every-rollouts) and at the end;
compare.py reads what it logged. `run` below is train.Run (or eval_only's EvalRun): the policy, its
eval sets, the flags and the open log.
Tests: tests/test_evalsets.py (benchmarks, avg@k, --eval-only), tests/test_regime.py (per level),
tests/test_train.py, tests/test_toy.py (the labs' start accuracies).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engines import dist
import verify
from engines.checkpoint import RunLock, prepare_run_dir, read_log, run_config
import toy
from harness import arith
from harness.cli import eval_table, progress_bars
from harness.data import fit_prompt_length, format_prompt, load_data
from harness.models import device_and_amp, load_model_and_tokenizer
from engines.rollout import VLLMGenerator, decode, generate_groups, hf_generate_greedy_and_sampled


# ----------------------------------------------------------------------------------------------
# One eval set: greedy accuracy, and the paper's avg@k / pass@k (k samples, T = 1.0, top-p 0.9)
# ----------------------------------------------------------------------------------------------
def evaluate(model, tokenizer, records: list[dict], args, generator=None) -> dict:
    ranks = dist.current()  # under torchrun each rank evaluates every W-th problem; outcomes are gathered
    all_records, records = records, records[ranks.rank::ranks.world_size]
    prompts = [format_prompt(r["question"], tokenizer, args) for r in records]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    answers = [r["answer"] for r in records]

    # Each distinct prompt prefilled once for its k samples and its greedy answer (exact up to rounding:
    # tests/test_speed.py); not on the toy labs, whose committed evaluations were drawn without it and stay bit for bit.
    share = getattr(args, "shared_prompt_prefill", False) and not toy.lab_name(args.model)

    def gen(k: int, greedy: bool, T: float, top_p: float) -> list[list[int]]:
        return generate_groups(model, tokenizer, prompt_ids, [k] * len(prompt_ids),
                               max_new_tokens=args.max_completion_length, temperature=T, top_p=top_p,
                               batch_size=args.generation_batch_size, greedy=greedy, generator=generator,
                               seed=args.seed, share_prompt_prefill=share)

    k = args.eval_samples
    if share and generator is None and k > 0:  # one prefill a prompt for both passes (same rounding caveat)
        texts, many = (decode(tokenizer, rows) for rows in hf_generate_greedy_and_sampled(
            model, tokenizer, prompt_ids, k, max_new_tokens=args.max_completion_length, temperature=1.0,
            top_p=0.9, batch_size=args.generation_batch_size))
    else:
        texts = decode(tokenizer, gen(1, True, 1.0, 1.0))
        many = decode(tokenizer, gen(k, False, 1.0, 0.9)) if k > 0 else []
    greedy = verify.rewards(texts, answers, last_number_fallback=args.last_number_fallback)
    sampled = verify.rewards(many, [a for a in answers for _ in range(k)], last_number_fallback=args.last_number_fallback)
    greedy, sampled = ([x for part in parts for x in part] for parts in zip(*dist.gather_object((greedy, sampled))))
    correct = np.array(sampled, dtype=float).reshape(-1, k) if k > 0 else None  # (n, k)
    result = accuracies(np.array(greedy, dtype=float), correct, k)
    if arith.is_task(args) and k > 0:  # the real-LM lab asks for just the number: format vs answers
        shown = dist.gather_object([arith.in_format(c) for c in many])
        result.update(format_split(np.array([x for part in shown for x in part], dtype=bool).reshape(-1, k),
                                   correct, k))
    # Per difficulty level: the paper's gains are largest on its hardest benchmarks, so a
    # gain of an allocator would show first on the hardest level. Records carry "level" on the labs
    # (toy-reason: level L = L + 2 addends); the gathered outcomes are in rank order, so the levels are too.
    levels = [r.get("level") for w in range(ranks.world_size) for r in all_records[w::ranks.world_size]]
    if levels and None not in levels:
        levels = np.array(levels)
        result["by_level"] = {str(L): {**accuracies(np.array(greedy, dtype=float)[levels == L],
                                                    None if correct is None else correct[levels == L], k),
                                       "n": int((levels == L).sum())}
                              for L in sorted(set(levels.tolist()))}
    return result


def format_split(in_format: np.ndarray, correct: np.ndarray, k: int) -> dict:
    """How often the k samples were in the asked format, and how often right when they were: (n, k)
    0/1 arrays in, so "learned the format" and "learned the answers" can be told apart
    (docs/results.md, the real-LM lab). acc_in_format is NaN-free: 0.0 when no sample was in format."""
    shown = int(in_format.sum())
    return {f"format@{k}": float(in_format.mean()),
            f"acc_in_format@{k}": float((correct * in_format).sum() / shown) if shown else 0.0}


def accuracies(greedy: np.ndarray, correct: np.ndarray | None, k: int) -> dict:
    """acc (greedy, (n,) 0/1), and from the (n, k) sampled outcomes avg@k (+ its standard error) and pass@k."""
    result = {"acc": float(np.mean(greedy))}
    if correct is not None:
        per_problem = correct.mean(axis=1)  # (n,) each problem's share of right samples
        result[f"avg@{k}"] = float(per_problem.mean())  # mean accuracy over k samples (paper's avg@16)
        # Standard error over problems (the k samples of one problem are not independent draws of
        # the benchmark): the noise of avg@k as an estimate of the model's accuracy on this kind of set.
        n = len(per_problem)
        result[f"avg@{k}_se"] = float(per_problem.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        result[f"pass@{k}"] = float((correct.max(axis=1) > 0).mean())  # any of k correct (n = k)
    return result


# ----------------------------------------------------------------------------------------------
# Every eval set, one log record
# ----------------------------------------------------------------------------------------------
def run_eval(run, step: int, extra: dict | None = None) -> dict:
    """Evaluate every eval set and log one record: NAME_acc (greedy), NAME_avg@k (+ _se) and
    NAME_pass@k per set; with benchmarks (every set but 'heldout'), eval_mean_avg@k, their plain mean
    as in the paper's Table 1 'Avg.' column; eval_seconds, what the evaluation cost."""
    t0 = time.time()
    record = {"type": "eval", "step": step, "rollouts": run.counters["rollouts"], **(extra or {})}
    # Evaluation samples (avg@k) from its own RNG, seeded the same at every evaluation, and leaves the
    # training RNG where it was: a run's rollouts do not depend on --eval-samples or --eval-every
    # (HF generate draws from the global torch RNG), and two evaluations of one run differ by the
    # model, not by the sampling noise (common random numbers).
    # Only this rank's own device is saved and restored (dist.own_rng).
    with dist.own_rng(run.device):
        torch.manual_seed(run.args.seed)
        dist.seed_rank(run.args.seed)  # under torchrun each rank samples its own share of the problems
        for name, records in run.eval_sets.items():
            with run.amp(), dist.gathered(run.model):
                results = evaluate(run.model, run.tokenizer, records, run.args, run.generator)
            for key, value in results.items():
                record[f"{name}_{key}"] = value
    k = run.args.eval_samples
    benchmarks = [name for name in run.eval_sets if name != "heldout"]
    if benchmarks:
        metric = f"avg@{k}" if k else "acc"
        record[f"eval_mean_{metric}"] = float(np.mean([record[f"{name}_{metric}"] for name in benchmarks]))
    record["eval_seconds"] = round(time.time() - t0, 3)
    run.write(record)
    return record


def evaluate_inside(run, step: int, before: int, after: int) -> None:
    """--eval-every-rollouts points X with before < X < after, i.e. inside this step's generation (a
    DAPO update of several blocks): the policy at X is the one before this update, which has spent
    those rollouts but not learnt from them yet. Logged with this update's step number, so a resume
    from the checkpoint before it drops them with the step (checkpoint.truncate_log)."""
    E = run.args.eval_every_rollouts
    if E:
        for X in range((before // E + 1) * E, after, E):
            run_eval(run, step + 1, extra={"rollouts": X, "before_update": True})


def eval_due(args, step: int, rollouts: int) -> bool:
    """An evaluation after this step (1-based): every --eval-every steps, or each time --eval-every-rollouts
    more rollouts are spent (it replaces --eval-every: cli.check_arm_flags). The last one is final_summary's."""
    E = args.eval_every_rollouts
    return bool((args.eval_every and step % args.eval_every == 0) or (E and rollouts % E == 0))


def final_summary(run, done: int) -> dict:
    """The run's final evaluation (at step `done`) and its summary record: steps, rollouts, the seconds
    training and evaluating took, the first and final accuracies (start_end). Resumed after a crash
    during the final evaluation, the log may hold it already: not twice."""
    evals = dist.on_rank0(lambda: [r for r in read_log(run.out / "log.jsonl") if r.get("type") == "eval"])
    final = (next((r for r in evals if r["step"] == done and not r.get("before_update")), None)
             or run_eval(run, done))
    return {"type": "summary", "step": done, "rollouts": run.counters["rollouts"],
            "train_seconds": round(run.counters["seconds"], 1),
            "eval_seconds": round(sum(r.get("eval_seconds", 0.0) for r in evals + [final] * (final not in evals)), 1),
            **start_end((evals or [final])[0], final, run.args.eval_samples)}


def start_end(first: dict, final: dict, k: int) -> dict:
    """The summary's accuracies at the first and the final evaluation. The paper's metric first:
    heldout_avg@k (k samples at T = 1.0, top-p 0.9; + _se) and eval_mean_avg@k over benchmarks; then
    greedy heldout_acc (other code reads heldout_acc_start/_end) and pass@k. None: no such set."""
    keys = [f"heldout_avg@{k}", f"heldout_avg@{k}_se", "heldout_acc", f"heldout_pass@{k}"] if k else ["heldout_acc"]
    keys += [key for key in (f"eval_mean_avg@{k}" if k else "eval_mean_acc",) if key in final]
    return {f"{key}_{when}": r.get(key) for key in keys for when, r in (("start", first), ("end", final))}


# ----------------------------------------------------------------------------------------------
# --eval-only: a model or checkpoint, evaluated without training
# ----------------------------------------------------------------------------------------------
@dataclass
class EvalRun:
    """What run_eval reads of a run, for --eval-only (a training run passes its train.Run, which has
    these fields and the rest): the policy, its eval sets and the open JSONL log."""
    args: argparse.Namespace
    model: torch.nn.Module
    tokenizer: object
    generator: VLLMGenerator | None  # --use-vllm; None: HF generate
    eval_sets: dict[str, list[dict]]
    device: torch.device
    amp: object  # () -> context manager: bf16 autocast for forward passes (--bf16), else a no-op
    log: object
    counters: dict

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()


def eval_only(args) -> dict:
    """--eval-only: evaluate --model (a name, or a checkpoint directory, which from_pretrained reads)
    on the eval sets, the paper's way (avg@k at T = 1.0, top-p 0.9), without training: OUTPUT_DIR/log.jsonl
    gets a config line and one eval record (eval_only: true); no optimizer, no checkpoint. For the base
    model's numbers before a run, or a finished checkpoint's after."""
    out = Path(args.output_dir)  # a folder, not empty, no symlinked run file (cli.check_path_flags)
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out), progress_bars(not args.no_progress):
        prepare_run_dir(out, args)  # a directory that holds a run is refused unless --overwrite
        if args.threads:
            torch.set_num_threads(args.threads)
        device, _, amp = device_and_amp(args)  # the training's device and autocast (fp32 weights here)
        torch.manual_seed(args.seed)
        counts = {"skipped_rows": 0, "skipped_long_prompts": 0}
        _, eval_sets = load_data(args, counts, need_train=False)
        model, tokenizer, model_path = load_model_and_tokenizer(args, device, torch.float32)
        fit_prompt_length([], eval_sets, tokenizer, args, counts, need_train=False)
        if not eval_sets:
            raise SystemExit("error: --eval-only has nothing to evaluate: pass --eval-datasets NAME, "
                             "--eval-files PATH, or --eval-size > 0")
        model.eval()
        run = EvalRun(args, model, tokenizer, VLLMGenerator(args, model_path) if args.use_vllm else None, eval_sets,
                      device, amp, (out / "log.jsonl").open("w"), counters={"rollouts": 0, "seconds": 0.0})
        run.write({"type": "config", "step": -1, **run_config(args), "model_path": model_path,
                   "device": str(device), **counts})
        record = run_eval(run, 0, extra={"eval_only": True, "model": args.model,
                                         "problems": {name: len(r) for name, r in eval_sets.items()}})
        run.log.close()
    print(eval_table(record, list(eval_sets), args.eval_samples))
    return record


# ----------------------------------------------------------------------------------------------
# The records read back (compare.py): a held-out metric against rollouts, the hardest level
# ----------------------------------------------------------------------------------------------
def curve(log: list[dict], key: str = "heldout_acc") -> tuple[np.ndarray, np.ndarray]:
    """(rollouts, held-out metric `key`) at each evaluation."""
    evals = [r for r in log if r["type"] == "eval"]
    return np.array([r["rollouts"] for r in evals], float), np.array([r[key] for r in evals], float)


def hardest_level(evals: list[dict], metric: str) -> dict:
    """The held-out set's hardest level (the paper's gains are largest on its hardest
    benchmarks): its level, problem count, the primary metric's curve and final value. The levels are
    the lab's (toy-reason: level L has L + 2 addends); {} for logs without per-level records."""
    levels = [r.get("heldout_by_level") for r in evals]
    if not levels or None in levels:
        return {}
    hard = max(levels[0], key=int)
    curve_ = [lv[hard][metric] for lv in levels]
    return {"hard_level": int(hard), "hard_n": levels[0][hard]["n"], "hard": curve_, "final_hard": float(curve_[-1])}
