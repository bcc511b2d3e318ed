"""The offline labs of coba-rl: graded tasks (worked running sums, 3-token arithmetic) and tiny Qwen2s.

CoBA-RL (arXiv 2602.03048) allocates rollouts by each prompt's pass rate, so the task it is shown
on must have pass rates spread over [0, 1]. Real math data and a real LLM need a GPU and a model
hub; this file makes the same shape of problem on a laptop CPU:

1. Graded, verifiable tasks. The default lab, toy-reason, writes worked solutions of running sums
   (section 1b below); the first two labs answer 3-token arithmetic (8 levels, from `3+4=` to `47*6=`): difficulty grows with the number
   of operands, digits and the operator, so one model sees easy, medium and hopeless prompts at
   once. Each record is {"question", "answer", "level"}; answers are integers checked by verify.py.
2. A tiny Qwen2-architecture causal LM (~0.8M parameters, the sizes that worked in
   docs/calibration.md) and a 17-symbol character tokenizer built with `tokenizers`, saved
   with `save_pretrained` so train.py loads it through the same `from_pretrained` path as a hub model.
3. A supervised warm-up on problems disjoint from the held-out split, so RL starts from non-zero,
   uneven pass rates (GRPO learns nothing from groups that never succeed).
4. The lab is shipped, not built: the same seeded warm-up gives different weights on
   different processors (docs/calibration.md: start greedy .211 / .336 / .340), so the warmed-up models
   are committed under lab/ with a toy.json of how they were built, pinned by SHA256, and their
   start accuracies are in START. `ensure_toy_model(name)` returns the committed directory;
   `python toy.py --rebuild NAME [--out DIR]` reruns a recipe and prints the new build's hash
   (the same on the machine that built it, a different one elsewhere).

The three models (`--model NAME` of train.py; toy and toy-strong share the arithmetic task,
held-out = make_splits(0)[1]; toy-reason has its own task, held-out = make_sum_splits(0)[1]):
  toy         lab/toy-w900: 900 steps, constant lr 3e-3 (docs/calibration.md: 600 too weak, 1200 too
              strong). The default: its held-out avg@8 rises most clearly under RL (.254 -> .321
              over the default run on calibration's .340 machine; this is that model).
  toy-strong  lab/toy-strong: 2,000 steps, lr 3e-3 cosine-decayed to 3e-4 (a constant 3e-3 is noisy
              late), then 1,000 steps with a fresh AdamW, lr 1e-3 cosine to 3e-5, levels weighted
              1,1,1,1,2,2,4,4 (more of the hard 3d+2d and 2d*1d, where pass rates are lowest). Start
              greedy .613, avg@8 .542, pass@8 .801. Its training pass rate at T 1.0 is near 1/2, so
              F_bar (window 1) falls below 0.5 in an ordinary run and eq. 6's sigmoid branch runs:
              100 default steps (M 32, G 8, lr 2e-4, window 1) had F_bar < .5 (and alpha_t < beta_t)
              in 24 (coba; 23) and 35 (uniform) of 100 steps, from step 1; F_t means by tens
              .50-.60. Caveat: held-out greedy fell .613 -> .402 (coba) / .477 (uniform) in those
              runs: lr 2e-4 is too high for this sharper model; use it to exercise eq. 6, not to
              show learning.
              Tried first (not shipped): 2,000 cosine steps alone (greedy .535; F_t ~.62, F_bar < .5
              in 5-6 of 100 steps), + 500 steps lr 1e-3 -> 1e-4, levels 1,1,1,1,2,2,3,3 (greedy
              .613; F_bar < .5 in 7 (coba) and 18 (uniform) of 100 steps).

  toy-reason  lab/toy-reason (the default): worked solutions. Running sums of 2-6 addends
              (1..99), completion `33+29=62,62+84=146####146`, 18 symbols, max positions 128. Phase 1:
              700 steps of clean solutions, batch 64, AdamW lr 2e-3 constant. Phase 2 ("noisy
              teacher", fresh AdamW, lr 1e-3, 200 steps): each partial sum slips by -10/-1/+1/+10 with
              probability .35 and the chain goes on from the slip. Start (512 held-out): avg@8 .270,
              greedy .494, pass@8 .730: sloppy sampling that compounds over the k - 1 steps, the
              regime in which RLVR lifts real models. Calibrated on this machine (AMD EPYC, one thread;
              docs/calibration.md's prototype used 900 phase-1 steps, but here 700 already gave greedy .50
              clean, and the 900-step start .327 avg@8 left less headroom than the 700-step .270):
              uniform GRPO, M 32, G 8, lr 3e-4, 60 steps took avg@8 .270 -> .443 (step 20) -> .528
              (step 60), greedy .494 -> .564, pass@8 .730 -> .758, in 302 s on a loaded machine (a
              step ~2.8 s, an evaluation of 512 problems x 9 completions ~25 s); F_t .75 at step 1,
              first below .5 at step 35. Pool of 1,024 train problems (revisited every 32 steps at
              M 32) and 1,024 held-out; completions ~32 tokens.
              Tried first (not shipped): phase 1 900 steps + the same phase 2: start avg@8 .327,
              greedy .664, pass@8 .787 (less headroom).

Run `python toy.py` to list the models, `python toy.py --rebuild toy` to rebuild one. Tested by
tests/test_toy.py (hash, recipe, start accuracies) and tests/test_train.py (the trainer runs on it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from harness.paths import check_path

REPO = Path(__file__).resolve().parent
# The cache directory can be moved (e.g. CI with a read-only checkout) with COBA_CACHE.
CACHE_DIR = Path(os.environ.get("COBA_CACHE", REPO / ".cache"))
TOY_VERSION = "v1"  # bump when the task, tokenizer or model config changes, so old caches are ignored

# ----------------------------------------------------------------------------------------------
# 1. The task: 8 graded levels of integer arithmetic
# ----------------------------------------------------------------------------------------------
# Each level draws operands uniformly; the format `a+b=` is the whole prompt and the answer is the
# integer, written as digits followed by EOS. Levels 0 and 2 have only 100 distinct problems, so the
# pool builder below caps its tries instead of looping until it finds N distinct ones.
LEVELS = [
    ("1d+1d", lambda r: f"{r.randint(0, 9)}+{r.randint(0, 9)}"),
    ("2d+1d", lambda r: f"{r.randint(10, 99)}+{r.randint(0, 9)}"),
    ("1d*1d", lambda r: f"{r.randint(0, 9)}*{r.randint(0, 9)}"),
    ("1d+1d-1d", lambda r: f"{r.randint(0, 9)}+{r.randint(0, 9)}-{r.randint(0, 9)}"),
    ("2d+2d", lambda r: f"{r.randint(10, 99)}+{r.randint(10, 99)}"),
    ("2d+1d-1d", lambda r: f"{r.randint(10, 99)}+{r.randint(0, 9)}-{r.randint(0, 9)}"),
    ("3d+2d", lambda r: f"{r.randint(100, 999)}+{r.randint(10, 99)}"),
    ("2d*1d", lambda r: f"{r.randint(10, 99)}*{r.randint(2, 9)}"),
]


def make_problem(rng: random.Random, level: int) -> dict:
    expr = LEVELS[level][1](rng)
    # eval is safe here: expr is built above from digits and + - * only.
    return {"question": f"{expr}=", "answer": str(eval(expr)), "level": level}


def make_pool(n: int, seed: int, exclude: set[str] = frozenset(), level_cap: dict[int, int] | None = None) -> list[dict]:
    """n distinct problems, levels round-robin, none of whose questions is in `exclude`, at most
    level_cap[level] problems of a capped level.

    Gives up on a level after 50 fruitless draws (levels 0 and 2 hold only 100 problems), so the
    pool may be a little smaller than n; the caller sees len(pool).
    """
    rng = random.Random(seed)
    seen, pool, misses = set(exclude), [], [0] * len(LEVELS)
    counts = [0] * len(LEVELS)
    cap = level_cap or {}
    for i in range(n * 50):
        if len(pool) >= n or min(misses) >= 50:
            break
        level = i % len(LEVELS)
        if counts[level] >= cap.get(level, n):
            misses[level] = 50  # full: from now on like an exhausted level
        if misses[level] >= 50:
            continue
        prob = make_problem(rng, level)
        if prob["question"] in seen:
            misses[level] += 1
            continue
        seen.add(prob["question"])
        pool.append(prob)
        counts[level] += 1
    return pool


def make_splits(seed: int = 0, n_train: int = 1024, n_test: int = 256) -> tuple[list[dict], list[dict]]:
    """(train pool, held-out test set), disjoint by question. The test split does not depend on
    n_train, so runs with different pool sizes are evaluated on the same problems.

    The test split takes at most half of a small level's 100 distinct problems (levels 0 and 2),
    so a large held-out set (compare.py uses 1,024) cannot empty those levels from the train pool;
    below 400 test problems the cap never binds and the split is as it always was."""
    test = make_pool(n_test, seed=10_000 + seed, level_cap={0: 50, 2: 50})
    train = make_pool(n_train, seed=20_000 + seed, exclude={p["question"] for p in test})
    return train, test


# ----------------------------------------------------------------------------------------------
# 1b. The worked-solution task of toy-reason: running sums, where errors compound with length
# ----------------------------------------------------------------------------------------------
# Prompt `33+29+84+51=`, completion `33+29=62,62+84=146,146+51=197####197` + EOS: one partial sum
# per step, then GSM8K's `####` answer line, which verify.py reads (with --no-last-number-fallback,
# so only a completion that states its answer is rewarded). Level L has L + 2 addends (2..6), each
# 1..99: a completion has k - 1 steps and each step can slip, so difficulty grows with the length
# of the reasoning, not with a harder single operation. Completions are 17-57 characters, mean ~37:
# the length of a short worked solution, which is what the paper allocates rollouts over.
SUM_LEVELS = [f"{k} addends" for k in range(2, 7)]
SUM_NOISE_DELTAS = (-10, -1, 1, 10)  # the noisy teacher's slips: a wrong carry or a wrong digit


def make_sum_problem(rng: random.Random, level: int, noise: float = 0.0) -> dict:
    """A running-sums problem of `level` (k = level + 2 addends) with its worked solution.

    noise > 0 (the warm-up's second phase only): each partial sum is replaced, with that
    probability, by sum + d (d from SUM_NOISE_DELTAS) and the chain continues from the wrong value,
    as a sloppy student would; the `answer` field stays the true sum."""
    terms = [rng.randint(1, 99) for _ in range(level + 2)]
    steps, acc = [], terms[0]
    for t in terms[1:]:
        new = acc + t
        if noise and rng.random() < noise:
            new += rng.choice(SUM_NOISE_DELTAS)
        steps.append(f"{acc}+{t}={new}")
        acc = new
    return {"question": "+".join(map(str, terms)) + "=", "answer": str(sum(terms)), "level": level,
            "solution": ",".join(steps) + f"####{acc}"}


def make_sum_splits(seed: int = 0, n_train: int = 1024, n_test: int = 1024) -> tuple[list[dict], list[dict]]:
    """toy-reason's (train pool, held-out set), disjoint by question, levels round-robin. The
    held-out set does not depend on n_train. There are ~99^k problems per level, so no cap binds.
    The pool is small on purpose (1,024, 32 steps an epoch at M 32): CoBA needs revisits to know
    a prompt's pass rate (docs/calibration.md: on a 4,608 pool every prompt was unseen after 72 steps,
    and CoBA allocated exactly as uniform)."""
    def pool(n: int, rng: random.Random, exclude: set[str]) -> list[dict]:
        out: list[dict] = []
        while len(out) < n:
            p = make_sum_problem(rng, len(out) % len(SUM_LEVELS))
            if p["question"] not in exclude:
                exclude.add(p["question"])
                out.append(p)
        return out

    test = pool(n_test, random.Random(30_000 + seed), set())
    train = pool(n_train, random.Random(40_000 + seed), {p["question"] for p in test})
    return train, test


# ----------------------------------------------------------------------------------------------
# 2. Tokenizer and model
# ----------------------------------------------------------------------------------------------
# EOS is spelled like Qwen's, so AutoTokenizer (which picks Qwen2Tokenizer from the model config)
# does not add an unknown "<|endoftext|>" token beyond the model's 17-row embedding.
SPECIAL = ["<pad>", "<|endoftext|>", "<bos>"]
CHARS = list("0123456789+-*=")
SUM_CHARS = list("0123456789+-=,#")  # toy-reason: `,` between steps, `####` before the answer, `-` for slips


def build_tokenizer(chars: list[str] = CHARS):
    """A character-level tokenizer (17 symbols for the arithmetic task, 18 for toy-reason's sums),
    wrapped as a transformers PreTrainedTokenizerFast.

    Left padding, because prompts are batched for generation and a causal LM must see each prompt
    end right before its first new token. The chat template just concatenates message contents,
    so the generic chat path of train.py also works on the toy.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one token per char
    tok.decoder = decoders.Fuse()  # decode "1","2" as "12", not "1 2"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|endoftext|>", bos_token="<bos>",
        padding_side="left",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def build_model(vocab_size: int, seed: int = 0, max_positions: int = 64):
    """Qwen2 at 1/10,000th scale: 4 layers, width 128, GQA with 2 KV heads (docs/calibration.md).
    max_positions: 64 for 3-token answers, 128 for toy-reason's worked solutions (up to ~76 tokens)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=max_positions, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    return Qwen2ForCausalLM(config)


# ----------------------------------------------------------------------------------------------
# 3. Supervised warm-up: teach the format and some arithmetic, not all of it
# ----------------------------------------------------------------------------------------------
def encode_sft_batch(tokenizer, problems: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (prompt + target + EOS) batch; labels are -100 except on the target and EOS,
    so the warm-up learns to answer, not to generate questions. The target is the worked
    `solution` where the problem has one (toy-reason), else the bare answer."""
    ids, labels = [], []
    for p in problems:
        q = tokenizer.encode(p["question"], add_special_tokens=False)
        a = tokenizer.encode(p.get("solution", p["answer"]), add_special_tokens=False) + [tokenizer.eos_token_id]
        ids.append(q + a)
        labels.append([-100] * len(q) + a)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])  # (N, L)
    label_t = torch.tensor([y + [-100] * (width - len(y)) for y in labels])  # (N, L)
    return input_ids, (input_ids != pad).long(), label_t


def warmup(model, tokenizer, exclude: set[str], steps: int, seed: int, batch_size: int = 128,
           lr: float = 3e-3, progress: bool = True, lr_schedule: str = "constant", final_lr: float = 0.0,
           level_weights: list[float] | None = None, task: str = "arith", noise: float = 0.0,
           on_step=None) -> None:
    """AdamW on fresh random problems of all levels (never the held-out ones), grad-clipped at 1.

    lr_schedule "constant" (the 900-step default) or "cosine" (lr -> final_lr over `steps`: a
    constant 3e-3 is noisy late, docs/calibration.md, so a long warm-up decays it). level_weights: the
    chance of each level per problem (None: uniform). The defaults draw exactly as before, so the
    shipped default model rebuilds bit for bit on the processor that built it.

    task "sums" (toy-reason) draws running-sums problems with worked solutions; noise is the chance
    that each of their partial sums slips (make_sum_problem): the "noisy teacher" phase.
    on_step(step, model): called after each optimizer step (a calibration script saves snapshots).
    """
    import math

    from tqdm.auto import tqdm

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = None
    if lr_schedule == "cosine":
        floor = final_lr / lr
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    elif lr_schedule != "constant":
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {lr_schedule!r}")
    n_levels = len(SUM_LEVELS) if task == "sums" else len(LEVELS)
    levels = range(n_levels)
    model.train()
    bar = tqdm(range(steps), desc="toy warm-up (SFT)", disable=not progress)
    for step in bar:
        batch = []
        while len(batch) < batch_size:
            level = rng.randrange(n_levels) if level_weights is None else rng.choices(levels, level_weights)[0]
            p = make_sum_problem(rng, level, noise) if task == "sums" else make_problem(rng, level)
            if p["question"] not in exclude:
                batch.append(p)
        input_ids, attn, labels = encode_sft_batch(tokenizer, batch)
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if on_step is not None:
            on_step(step + 1, model)
    model.eval()


# ----------------------------------------------------------------------------------------------
# 4. The shipped models: committed under lab/, rebuilt only on request
# ----------------------------------------------------------------------------------------------
# The same seeded, single-threaded warm-up gives different weights on different processors
# (docs/calibration.md: start greedy .211 / .336 / .340 on three machines), so the lab is not built at
# run time: the warmed-up models are committed, and every machine trains from the same weights.
# RECIPES say how each was built (`python toy.py --rebuild NAME` reruns it); SHA256 pins the
# committed weights; START holds their held-out accuracies (tests/test_toy.py re-measures them).
LAB_DIR = REPO / "lab"

RECIPES = {
    # The default: the docs/calibration.md warm-up, the one whose held-out avg@8 rises most clearly.
    "toy": dict(dir="toy-w900", seed=0, warmup_steps=900, lr=3e-3, lr_schedule="constant", final_lr=0.0,
                level_weights=None),
    # F_bar falls below 0.5 in an ordinary run, so eq. 6's sigmoid branch runs (alpha_t < beta_t).
    # `then`: a second warm-up phase (fresh AdamW, problem stream seed + 1) run after the first.
    "toy-strong": dict(dir="toy-strong", seed=0, warmup_steps=2000, lr=3e-3, lr_schedule="cosine", final_lr=3e-4,
                       level_weights=None,
                       then=dict(steps=1000, lr=1e-3, lr_schedule="cosine", final_lr=3e-5,
                                 level_weights=[1, 1, 1, 1, 2, 2, 4, 4])),
    # Worked solutions: running sums. Phase 1 teaches the format and the arithmetic on
    # clean solutions; phase 2, the "noisy teacher", fine-tunes on solutions whose partial sums slip
    # with probability `noise`, so the model samples sloppy chains that RL can clean up (pass@8 high,
    # avg@8 low: the regime in which RLVR lifts real models). docs/calibration.md: a clean start barely
    # learns under GRPO, because its errors are capability errors that 30k rollouts do not teach.
    "toy-reason": dict(dir="toy-reason", task="sums", seed=0, warmup_steps=700, lr=2e-3, lr_schedule="constant",
                       final_lr=0.0, level_weights=None, batch_size=64, max_positions=128,
                       then=dict(steps=200, lr=1e-3, lr_schedule="constant", final_lr=0.0, level_weights=None,
                                 noise=0.35)),
}
TOY_MODELS = tuple(RECIPES)  # the --model names train.py treats as the toy

# SHA-256 of each committed model.safetensors (tests/test_toy.py checks the files against it).
# toy-reason's was reproduced by `python toy.py --rebuild toy-reason` (one thread, 2026-12-06, on the
# AMD EPYC that built it: "same as the committed lab/toy-reason", ~10 min beside a sweep).
SHA256 = {
    "toy": "8e458e3a28fcee682f8f904d45aee797fc6566e06636bcd5289822f463638caa",
    "toy-strong": "b8704ffb97abc6b672c6d085c5db246d5069889d374f7b079aeecebc37c369a5",
    "toy-reason": "684b0023ff77d10b83aa01e2cc25e754d14e1aa2c21f6a581ae37f99e2beb89d",
}

# Start accuracies on the first 256 held-out problems of each lab's task (task_splits(task, 0,
# n_test=256)[1]) measured with evaluate.evaluate: greedy, and 8 samples at T 1.0, top-p 0.9, seed 0
# (avg@8, pass@8).
START = {
    "toy": {"acc": 87 / 256, "avg@8": 521 / 2048, "pass@8": 143 / 256},  # .340, .254, .559
    "toy-strong": {"acc": 157 / 256, "avg@8": 1110 / 2048, "pass@8": 205 / 256},  # .613, .542, .801
    "toy-reason": {"acc": 124 / 256, "avg@8": 524 / 2048, "pass@8": 183 / 256},  # .484, .256, .715
}


def lab_name(model: str) -> str | None:
    """The shipped lab a --model means: its name, or the lab a checkpoint directory was trained from
    (its run_config.json's model), else None. A toy-reason checkpoint keeps toy-reason's task."""
    if model in RECIPES:
        return model
    try:
        saved = json.loads((Path(model) / "run_config.json").read_text()).get("model")
    except (OSError, ValueError, TypeError):
        return None
    return saved if saved in RECIPES else None


def task_of(name: str) -> str:
    """The task a toy model is trained and evaluated on: "arith" (toy, toy-strong) or "sums" (toy-reason)."""
    return RECIPES[name].get("task", "arith")


def task_splits(task: str, seed: int = 0, n_train: int = 1024, n_test: int | None = None) -> tuple[list[dict], list[dict]]:
    """(train pool, held-out set) of a task; n_test None: the task's own default (256 / 1,024)."""
    if task == "sums":
        return make_sum_splits(seed, n_train, 1024 if n_test is None else n_test)
    return make_splits(seed, n_train, 256 if n_test is None else n_test)


def weights_sha256(model_dir: Path) -> str:
    import hashlib

    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()


def ensure_toy_model(name: str = "toy", progress: bool = True) -> Path:
    """The committed directory of toy model `name` (no warm-up at run time). `progress` is unused
    and kept for callers of the old building version."""
    if name not in RECIPES:
        raise SystemExit(f"error: unknown toy model {name!r}: pass one of {', '.join(TOY_MODELS)}")
    out = LAB_DIR / RECIPES[name]["dir"]
    if not (out / "model.safetensors").exists():
        raise SystemExit(f"error: {out} is missing (a partial checkout?): restore lab/ from git, "
                         f"or rebuild it with `python toy.py --rebuild {name} --out {out}`")
    return out


def machine() -> str:
    """The processor, for toy.json: warm-up weights depend on it."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({platform.machine()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_toy_model(name: str, out: Path | None = None, progress: bool = True) -> Path:
    """Run RECIPES[name]'s warm-up from scratch and save model + tokenizer + toy.json to `out`
    (default: COBA_CACHE/rebuild-NAME). On another processor the weights (and hash) will differ.

    Written to a temporary directory and renamed into place, so an interrupted build never leaves
    a half-written model behind.
    """
    import platform

    import transformers

    r = RECIPES[name]
    out = Path(out) if out is not None else CACHE_DIR / f"rebuild-{name}"
    if out.exists():
        raise SystemExit(f"error: {out} exists: remove it or pass another --out")
    t0 = time.time()
    # One torch thread: the tiny model is dispatch-bound, a second thread does not help (docs/calibration.md).
    torch.set_num_threads(1)
    task, batch = r.get("task", "arith"), r.get("batch_size", 128)
    tokenizer = build_tokenizer(SUM_CHARS if task == "sums" else CHARS)
    model = build_model(len(tokenizer), seed=r["seed"], max_positions=r.get("max_positions", 64))
    _, test = task_splits(task, r["seed"])
    warmup(model, tokenizer, exclude={p["question"] for p in test}, steps=r["warmup_steps"], seed=r["seed"],
           lr=r["lr"], lr_schedule=r["lr_schedule"], final_lr=r["final_lr"], level_weights=r["level_weights"],
           progress=progress, batch_size=batch, task=task)
    if r.get("then"):  # a second phase: fresh AdamW, its own problem stream (seed + 1)
        t = r["then"]
        warmup(model, tokenizer, exclude={p["question"] for p in test}, steps=t["steps"], seed=r["seed"] + 1,
               lr=t["lr"], lr_schedule=t["lr_schedule"], final_lr=t["final_lr"], level_weights=t["level_weights"],
               progress=progress, batch_size=batch, task=task, noise=t.get("noise", 0.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".building-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"name": name, **{k: v for k, v in r.items() if k != "dir"}, "batch_size": batch, "grad_clip": 1.0,
            "toy_version": TOY_VERSION, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "machine": machine(), "threads": 1,
            "build_seconds": round(time.time() - t0, 1), "sha256": weights_sha256(tmp)}
    (tmp / "toy.json").write_text(json.dumps(info, indent=1) + "\n")
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rebuild", metavar="NAME", choices=TOY_MODELS, default=None,
                    help=f"rerun the warm-up of a shipped model ({', '.join(TOY_MODELS)}) and print its hash")
    ap.add_argument("--out", default=None, help="where --rebuild writes (default COBA_CACHE/rebuild-NAME)")
    args = ap.parse_args(argv)
    out = None if args.out is None else check_path("--out", args.out, "dir")  # '' is not "here" (harness/paths.py)
    if args.rebuild:
        path = build_toy_model(args.rebuild, out)
        same = weights_sha256(path) == SHA256[args.rebuild]
        print(f"rebuilt {args.rebuild}: {path}\nsha256 {weights_sha256(path)} "
              f"({'same as' if same else 'differs from'} the committed lab/{RECIPES[args.rebuild]['dir']})")
        return
    for name in TOY_MODELS:
        print(f"{name}: {ensure_toy_model(name)}  start {START[name]}")
    for task, levels in (("arith", [name for name, _ in LEVELS]), ("sums", SUM_LEVELS)):
        train, test = task_splits(task, 0)
        print(f"task {task}: train pool {len(train)} problems, held-out {len(test)}; levels: {', '.join(levels)}")


if __name__ == "__main__":
    main()
