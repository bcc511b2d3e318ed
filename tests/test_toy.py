"""The offline task and model of toy.py. Run: python -m pytest -q tests/test_toy.py"""
import collections

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
