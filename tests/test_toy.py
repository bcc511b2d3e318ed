"""The offline task and the committed models of toy.py (issue 19). Run: python -m pytest -q tests/test_toy.py"""
import collections
import json
import math

import pytest

import toy


def test_problems_are_correct_and_graded():
    import random

    rng = random.Random(0)
    for level in range(len(toy.LEVELS)):
        for _ in range(50):
            p = toy.make_problem(rng, level)
            assert p["question"].endswith("=") and p["level"] == level
            assert int(p["answer"]) == eval(p["question"][:-1])
    # Level 3 (a+b-c) can go negative, so the verifier must read a minus sign: 0+0-9 = -9.
    assert any(int(toy.make_problem(rng, 3)["answer"]) < 0 for _ in range(200))


def test_pool_is_distinct_disjoint_and_terminates():
    train, test = toy.make_splits(0, n_train=1024, n_test=256)
    assert len(test) == 256 and len(train) == 1024
    assert len({p["question"] for p in train}) == len(train)
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    # Levels 0 and 2 hold only 100 distinct problems each: asking for more must stop, not loop.
    small = toy.make_pool(10_000, seed=1)
    counts = collections.Counter(p["level"] for p in small)
    assert counts[0] <= 100 and counts[2] <= 100


def test_splits_are_seeded():
    assert toy.make_splits(3, 64, 16) == toy.make_splits(3, 64, 16)
    assert toy.make_splits(3, 64, 16) != toy.make_splits(4, 64, 16)


def test_sum_problems_carry_a_worked_solution_the_verifier_reads():
    """toy-reason's task: k = level + 2 addends; the clean solution's partial sums are right and its
    `####` line is the answer, which verify.py reads with no last-number fallback (train.py's preset)."""
    import random

    import verify

    rng = random.Random(0)
    for level in range(len(toy.SUM_LEVELS)):
        for _ in range(50):
            p = toy.make_sum_problem(rng, level)
            terms = [int(t) for t in p["question"][:-1].split("+")]
            assert len(terms) == level + 2 and all(1 <= t <= 99 for t in terms)
            assert int(p["answer"]) == sum(terms)
            steps, answer = p["solution"].split("####")
            assert answer == p["answer"] and len(steps.split(",")) == level + 1
            for step in steps.split(","):
                lhs, rhs = step.split("=")
                assert eval(lhs) == int(rhs)
            assert verify.rewards([p["solution"]], [p["answer"]], last_number_fallback=False) == [1.0]  # exact: 0/1 rewards
    # a completion that never states its answer earns nothing, even if its last number is right
    assert verify.rewards(["26+4=30"], ["30"], last_number_fallback=False) == [0.0]  # exact: 0/1 rewards


def test_noisy_teacher_slips_and_continues_from_the_slip():
    """Phase 2's solutions: each partial sum slips by one of SUM_NOISE_DELTAS with the given chance,
    the next step starts from the slipped value, and the `answer` stays the true sum."""
    import random

    rng = random.Random(1)
    slips = steps_seen = 0
    for _ in range(400):
        p = toy.make_sum_problem(rng, 4, noise=0.35)
        chain, final = p["solution"].split("####")
        prev = None
        for step in chain.split(","):
            lhs, rhs = step.split("=")
            a, b = (int(x) for x in lhs.split("+", 1)) if not lhs.startswith("-") else (None, None)
            if a is None:  # a slipped negative running value: "-3+45=42"
                a, b = int(lhs[: lhs.index("+", 1)]), int(lhs[lhs.index("+", 1) + 1 :])
            if prev is not None:
                assert a == prev  # the chain continues from what was written, slip or not
            delta = int(rhs) - (a + b)
            assert delta == 0 or delta in toy.SUM_NOISE_DELTAS
            slips += delta != 0
            steps_seen += 1
            prev = int(rhs)
        assert int(final) == prev
        assert int(p["answer"]) == sum(int(t) for t in p["question"][:-1].split("+"))
    assert 0.30 < slips / steps_seen < 0.40, slips / steps_seen  # 1,600 draws of p = .35: SE .012


def test_sum_splits_are_disjoint_seeded_and_independent_of_the_pool_size():
    train, test = toy.make_sum_splits(0)
    assert len(train) == 1024 and len(test) == 1024
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert toy.make_sum_splits(0, 64, 1024)[1] == test  # runs with other pools evaluate on the same set
    assert toy.make_sum_splits(0, 64, 256)[1] == test[:256]  # the test's 256 are the first 256
    assert collections.Counter(p["level"] for p in test) == {lvl: 1024 // 5 + (lvl < 1024 % 5) for lvl in range(5)}


def test_each_lab_trains_on_its_own_task():
    """--model toy-reason (or a checkpoint trained from it) loads the sums task; toy keeps arithmetic."""
    import argparse

    from harness import data

    def loaded(model):
        args = argparse.Namespace(dataset="toy", model=model, train_size=16, eval_size=8, eval_files=[],
                                  prompts_per_step=4)
        train, evals = data.load_data(args)
        return train[0]["question"], evals["heldout"]

    q, held = loaded("toy-reason")
    assert held == toy.make_sum_splits(0, 16, 8)[1] and q.count("+") >= 1 and "*" not in q
    assert loaded("toy")[1] == toy.make_splits(0, 16, 8)[1]
    assert toy.lab_name("toy-reason") == "toy-reason" and toy.lab_name("Qwen2.5-1.5B") is None


def test_tokenizer_round_trip():
    tok = toy.build_tokenizer()
    assert len(tok) == 17
    ids = tok("47*6=-12", add_special_tokens=False)["input_ids"]
    assert len(ids) == 8 and tok.decode(ids) == "47*6=-12"
    assert tok.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False) == "3+4="
    assert tok.padding_side == "left"


def test_warmed_up_model_has_uneven_pass_rates(toy_model_dir):
    """RL needs some successes and some failures: the warmed-up model solves easy levels more."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(toy_model_dir)
    model = AutoModelForCausalLM.from_pretrained(toy_model_dir).eval()
    _, test = toy.make_splits(0)
    enc = tok([p["question"] for p in test], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=8, pad_token_id=0, eos_token_id=1)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    correct = [t.strip() == p["answer"] for t, p in zip(texts, test)]
    acc_by_level = collections.defaultdict(list)
    for c, p in zip(correct, test):
        acc_by_level[p["level"]].append(c)
    acc = sum(correct) / len(correct)
    assert 0.1 < acc < 0.8, acc
    easy = sum(acc_by_level[0]) / len(acc_by_level[0])
    hard = sum(acc_by_level[7]) / len(acc_by_level[7])
    assert easy > hard, (easy, hard)


# ----------------------------------------------------------------------------------------------
# The shipped lab (issue 19): committed weights, pinned by hash, with their start accuracies
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", toy.TOY_MODELS)
def test_committed_model_matches_its_hash_and_recipe(name):
    """Every --model toy name is a committed directory whose weights are the ones toy.py pins, and
    whose toy.json records the recipe that built them (so `toy.py --rebuild` reruns that recipe)."""
    path = toy.ensure_toy_model(name)
    assert path.parent == toy.LAB_DIR
    assert toy.weights_sha256(path) == toy.SHA256[name]
    info = json.loads((path / "toy.json").read_text())
    assert info["sha256"] == toy.SHA256[name] and info["name"] == name
    for key, value in toy.RECIPES[name].items():
        if key != "dir":
            assert info[key] == value, key
    assert {"torch", "machine", "build_seconds"} <= set(info)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (path / f).exists(), f


def test_unknown_or_missing_toy_model_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="unknown toy model 'toy-nope': pass one of toy"):
        toy.ensure_toy_model("toy-nope")
    monkeypatch.setattr(toy, "LAB_DIR", tmp_path)  # a checkout without lab/
    with pytest.raises(SystemExit, match="is missing .*python toy.py --rebuild toy"):
        toy.ensure_toy_model("toy")


# Tolerances of the start accuracies, derived (not a processor's luck):
# - greedy: an answer flips only at an argmax near-tie. Perturbing every committed weight by a
#   relative 1e-4 (about 1,000x float32's epsilon, far more than a change of processor) changed 0
#   of 256 greedy answers of either model (and 0 resp. 3 of 2,048 samples); we allow GREEDY_FLIPS.
#   toy-reason (issue 30; ~32-token completions, so more positions at which to flip): the same
#   perturbation changed 0 of 256 greedy answers and 0 of 2,048 samples.
# - avg@8, pass@8: HF sampling draws from the global torch RNG for every row of a batch until all
#   rows end, so one flipped token that ends a batch earlier or later shifts every later draw: the
#   rest is then a fresh sample. We allow 3 standard errors of the difference of two independent
#   draws, sqrt(2 v (1 - v) / n), with n = 2,048 samples (avg@8) or 256 problems (pass@8);
#   v (1 - v) / n bounds the variance of either mean over fixed problems.
GREEDY_FLIPS = 3


def redraw_tolerance(v: float, n: int) -> float:
    return 3 * math.sqrt(2 * v * (1 - v) / n)


@pytest.mark.parametrize("name", toy.TOY_MODELS)
def test_start_accuracies_are_the_recorded_ones(name):
    """evaluate.evaluate on the default held-out set (256 problems): greedy within GREEDY_FLIPS
    problems, avg@8 and pass@8 (T 1.0, top-p 0.9, torch seed 0) within redraw_tolerance."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness import evaluate
    import train

    path = toy.ensure_toy_model(name)
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--model", name, "--eval-samples", "8", "--no-progress"]), ap)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    _, test = toy.task_splits(toy.task_of(name), 0, n_test=256)
    assert len(test) == 256
    torch.manual_seed(0)
    with torch.no_grad():
        got = evaluate.evaluate(model, tokenizer, test, args)
    want = toy.START[name]
    assert abs(got["acc"] - want["acc"]) * 256 <= GREEDY_FLIPS + 1e-9, (got, want)
    assert abs(got["avg@8"] - want["avg@8"]) <= redraw_tolerance(want["avg@8"], 256 * 8), (got, want)
    assert abs(got["pass@8"] - want["pass@8"]) <= redraw_tolerance(want["pass@8"], 256), (got, want)


def test_rebuild_writes_a_model_and_its_record(tmp_path, monkeypatch):
    """The rebuild path runs a recipe end to end (here 2 warm-up steps, not 900) and records it."""
    monkeypatch.setitem(toy.RECIPES, "toy-tiny", dict(dir="toy-tiny", seed=0, warmup_steps=2, lr=3e-3,
                                                      lr_schedule="cosine", final_lr=3e-4, level_weights=None))
    path = toy.build_toy_model("toy-tiny", tmp_path / "out", progress=False)
    info = json.loads((path / "toy.json").read_text())
    assert info["warmup_steps"] == 2 and info["sha256"] == toy.weights_sha256(path)
    assert (path / "config.json").exists() and not list(tmp_path.glob(".building-*"))
    with pytest.raises(SystemExit, match="exists: remove it or pass another --out"):
        toy.build_toy_model("toy-tiny", path, progress=False)
