"""The offline default of coba-rl: a graded arithmetic task and a tiny Qwen2 that half-solves it.

CoBA-RL (arXiv 2602.03048) allocates rollouts by each prompt's pass rate, so the task it is shown
on must have pass rates spread over [0, 1]. Real math data and a real LLM need a GPU and a model
hub; this file makes the same shape of problem on a laptop CPU in about two minutes:

1. A graded, verifiable task (8 levels, from `3+4=` to `47*6=`): difficulty grows with the number
   of operands, digits and the operator, so one model sees easy, medium and hopeless prompts at
   once. Each record is {"question", "answer", "level"}; answers are integers checked by verify.py.
2. A tiny Qwen2-architecture causal LM (~0.8M parameters, the sizes that worked in
   ../shared/calibration.md) and a 17-symbol character tokenizer built with `tokenizers`, saved
   with `save_pretrained` so train.py loads it through the same `from_pretrained` path as a hub model.
3. A short supervised warm-up on problems disjoint from the held-out split, so RL starts from
   non-zero, uneven pass rates (GRPO learns nothing from groups that never succeed). The warmed-up
   model is cached under .cache/ and built once.

Departures/choices (all ours): the level list, pool sizes and warm-up length come from
calibration.md (900 steps gave mean pass rate ~.35; 600 too weak, 1200 too strong).

Run `python toy.py` to build the model and print its starting pass rates. Tested by
tests/test_train.py (the trainer runs on this model) and tests/test_toy.py.
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
# 2. Tokenizer and model
# ----------------------------------------------------------------------------------------------
# EOS is spelled like Qwen's, so AutoTokenizer (which picks Qwen2Tokenizer from the model config)
# does not add an unknown "<|endoftext|>" token beyond the model's 17-row embedding.
SPECIAL = ["<pad>", "<|endoftext|>", "<bos>"]
CHARS = list("0123456789+-*=")


def build_tokenizer():
    """A 17-symbol character-level tokenizer, wrapped as a transformers PreTrainedTokenizerFast.

    Left padding, because prompts are batched for generation and a causal LM must see each prompt
    end right before its first new token. The chat template just concatenates message contents,
    so the generic chat path of train.py also works on the toy.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one token per char
    tok.decoder = decoders.Fuse()  # decode "1","2" as "12", not "1 2"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|endoftext|>", bos_token="<bos>",
        padding_side="left",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def build_model(vocab_size: int, seed: int = 0):
    """Qwen2 at 1/10,000th scale: 4 layers, width 128, GQA with 2 KV heads (calibration.md)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    return Qwen2ForCausalLM(config)


# ----------------------------------------------------------------------------------------------
# 3. Supervised warm-up: teach the format and some arithmetic, not all of it
# ----------------------------------------------------------------------------------------------
def encode_sft_batch(tokenizer, problems: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (prompt + answer + EOS) batch; labels are -100 except on the answer and EOS,
    so the warm-up learns to answer, not to generate questions."""
    ids, labels = [], []
    for p in problems:
        q = tokenizer.encode(p["question"], add_special_tokens=False)
        a = tokenizer.encode(p["answer"], add_special_tokens=False) + [tokenizer.eos_token_id]
        ids.append(q + a)
        labels.append([-100] * len(q) + a)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])  # (N, L)
    label_t = torch.tensor([y + [-100] * (width - len(y)) for y in labels])  # (N, L)
    return input_ids, (input_ids != pad).long(), label_t


def warmup(model, tokenizer, exclude: set[str], steps: int, seed: int, batch_size: int = 128,
           lr: float = 3e-3, progress: bool = True) -> None:
    """AdamW on fresh random problems of all levels (never the held-out ones), grad-clipped at 1."""
    from tqdm.auto import tqdm

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    bar = tqdm(range(steps), desc="toy warm-up (SFT)", disable=not progress)
    for _ in bar:
        batch = []
        while len(batch) < batch_size:
            p = make_problem(rng, rng.randrange(len(LEVELS)))
            if p["question"] not in exclude:
                batch.append(p)
        input_ids, attn, labels = encode_sft_batch(tokenizer, batch)
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


def toy_model_dir(seed: int = 0, warmup_steps: int = 900) -> Path:
    return CACHE_DIR / f"toy-model-{TOY_VERSION}-seed{seed}-warm{warmup_steps}"


def ensure_toy_model(seed: int = 0, warmup_steps: int = 900, progress: bool = True) -> Path:
    """Build (once) and return the directory of the warmed-up toy model + tokenizer.

    Written to a temporary directory and renamed into place, so a run interrupted mid-build, or two
    processes building at once, never leave a half-written model behind.
    """
    out = toy_model_dir(seed, warmup_steps)
    if (out / "config.json").exists():
        return out
    t0 = time.time()
    # One torch thread: the tiny model is dispatch-bound, a second thread does not help (calibration.md).
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), seed=seed)
    _, test = make_splits(seed)
    warmup(model, tokenizer, exclude={p["question"] for p in test}, steps=warmup_steps, seed=seed,
           progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".building-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "toy.json").write_text(json.dumps(
        {"seed": seed, "warmup_steps": warmup_steps, "build_seconds": round(time.time() - t0, 1)}))
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="task and model seed (default 0)")
    ap.add_argument("--warmup-steps", type=int, default=900, help="SFT steps (calibration: 900)")
    args = ap.parse_args()
    path = ensure_toy_model(args.seed, args.warmup_steps)
    print(f"toy model ready: {path}")
    train, test = make_splits(args.seed)
    print(f"train pool {len(train)} problems, held-out {len(test)}; levels: "
          + ", ".join(name for name, _ in LEVELS))


if __name__ == "__main__":
    main()
