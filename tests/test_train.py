"""End-to-end: the trainer on the toy model. Run: python -m pytest -q tests/test_train.py

Small runs (M = 8 prompts, G = 4, a 32-problem pool revisited every 4 steps so pass rates exist
from step 5 on) keep each run to a few seconds on one CPU core.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import data
import train
from harness import run as run_setup

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
         "--eval-every", "0", "--no-progress", "--max-budget", "12"]


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("allocator", ["uniform", "knapsack", "coba", "coba-released"])
def test_each_allocator_trains_and_logs(tmp_path, toy_model_dir, allocator):
    # Knapsack-RL counts a prompt as valid only after 8 recorded rollouts: the third visit here
    n_steps = 12 if allocator == "knapsack" else 8
    summary = train.main(SMALL + ["--steps", str(n_steps), "--allocator", allocator, "--output-dir", str(tmp_path)])
    log = read_log(tmp_path)
    assert log[0]["type"] == "config" and log[0]["allocator"] == allocator
    steps = [r for r in log if r["type"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, n_steps + 1))
    for r in steps:
        # B_total = M * G = 32, every B_i in [B_low, B_up] = [2, 12]
        assert sum(r["budgets"]) == 32 and len(r["budgets"]) == 8
        assert all(2 <= b <= 12 for b in r["budgets"])
        assert 0.0 <= r["reward"] <= 1.0 and 0.0 <= r["F_t"] <= 1.0
        assert abs(r["alpha_t"] + r["beta_t"] - 11.0) < 1e-9  # kappa (eq. 7)
        for key in ("loss", "clip_frac", "kl", "ratio_mean", "entropy", "zero_signal_groups", "tau"):
            assert key in r
    # The 32-problem pool is revisited from step 5: the first epoch is uniform (no pass rates yet).
    assert all(r["budgets"] == [4] * 8 for r in steps[:4])
    if allocator == "knapsack":  # visit 2 (4 recorded rollouts) is still uniform, visit 3 is not
        assert all(r["budgets"] == [4] * 8 for r in steps[4:8])
        assert any(r["budgets"] != [4] * 8 for r in steps[8:]), "knapsack never reallocated"
    elif allocator != "uniform":
        assert any(r["budgets"] != [4] * 8 for r in steps[4:]), "CoBA never reallocated"
        assert steps[4]["seen"] == 8
    assert steps[-1]["rollouts"] == n_steps * 32
    assert summary["type"] == "summary" and 0.0 <= summary["heldout_acc_end"] <= 1.0
    assert (tmp_path / f"checkpoint-{n_steps}" / "trainer_state.pt").exists() and (tmp_path / f"checkpoint-{n_steps}" / "COMPLETE").exists()


def test_ctrl_c_then_resume_continues_exactly(tmp_path, toy_model_dir, monkeypatch):
    """A real SIGINT during step 3: the step finishes, a checkpoint is written, and --resume then
    gives the same budgets, rewards and losses for steps 4-6 as a run that was never interrupted."""
    args = SMALL + ["--steps", "6", "--save-every", "100"]
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    train.main(args + ["--output-dir", str(ref_dir)])
    ref = [r for r in read_log(ref_dir) if r["type"] == "train"]

    real_rewards, calls = train.verify.rewards, {"n": 0}

    def rewards_then_ctrl_c(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2 + 3:  # 2 calls for the start eval (greedy, avg@8), then one per step: interrupt step 3
            os.kill(os.getpid(), signal.SIGINT)
        return real_rewards(*a, **kw)

    monkeypatch.setattr(train.verify, "rewards", rewards_then_ctrl_c)
    with pytest.raises(SystemExit) as stopped:  # exit 130, as after Ctrl-C, once the checkpoint is written
        train.main(args + ["--output-dir", str(cut_dir)])
    monkeypatch.setattr(train.verify, "rewards", real_rewards)
    assert stopped.value.code == 130 and train.find_checkpoint(cut_dir).name == "checkpoint-3"
    assert [r["step"] for r in read_log(cut_dir) if r["type"] == "train"] == [1, 2, 3]

    train.main(args + ["--output-dir", str(cut_dir), "--resume"])
    resumed = [r for r in read_log(cut_dir) if r["type"] == "train"]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(ref, resumed):
        assert a["budgets"] == b["budgets"] and a["prompt_idx"] == b["prompt_idx"]
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(["--total-budget", "10", "--prompts-per-step", "8", "--min-budget", "2"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "total" in err.lower() and "budget" in err.lower()
    # allocate.py says it in eq. 3's terms; the command line puts the flag that sets B_total in front
    assert err.endswith("--total-budget: B_total = 10 < M x B_low = 8 x 2 = 16: eq. 3 is infeasible"), err
    with pytest.raises(SystemExit):
        train.main(["--kappa", "2"])
    assert "--kappa: kappa = alpha_t + beta_t (eq. 7)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--schedule", "fixed:1"])
    assert "fixed" in capsys.readouterr().err
    missing = run_setup.argparse.Namespace(model=str(tmp_path / "no-such-model"), no_progress=True,
                                       gradient_checkpointing=False)
    with pytest.raises(SystemExit, match="cannot load model .*no-such-model.*local model directory"):
        run_setup.load_model_and_tokenizer(missing, train.torch.device("cpu"), train.torch.float32)


def test_local_dataset_file_and_missing_column(tmp_path, toy_model_dir):
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{a}=", "a": str(2 * a)}) + "\n" for a in range(40)))
    args = train.build_parser().parse_args(["--dataset", str(data), "--question-field", "q",
                                            "--answer-field", "a", "--eval-size", "8",
                                            "--prompts-per-step", "4"])
    args.prompt_template, args.model = "{question}", "toy"
    train_set, evals = run_setup.load_data(args)
    assert len(train_set) == 32 and len(evals["heldout"]) == 8
    assert all(r["answer"] == str(2 * int(r["question"].split("+")[0])) for r in train_set)
    args.question_field = "question"
    with pytest.raises(SystemExit, match=r"no column 'question' \(columns: a, q\): pass --question-field"):
        run_setup.load_data(args)


def test_reference_answer_extraction():
    assert data.reference_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
    assert data.reference_answer("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert data.reference_answer(" 17 ") == "17"


def test_default_command_runs_offline(tmp_path, toy_model_dir):
    """`python train.py --steps 2` with every other flag at its default exits 0 without a network."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "train.py", "--steps", "2", "--output-dir", str(tmp_path),
                           "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "held-out avg@8 (T=1.0, top-p 0.9)" in proc.stdout and "greedy accuracy" in proc.stdout
    assert (tmp_path / "log.jsonl").exists()


def test_avg_at_k_and_pass_at_k_are_logged(tmp_path, toy_model_dir):
    """--eval-samples k: the paper's avg@k (mean accuracy of k samples at T = 1.0, top-p 0.9) and
    pass@k (any of the k right) beside greedy accuracy; pass@k >= avg@k by definition."""
    summary = train.main(SMALL + ["--steps", "1", "--eval-samples", "3", "--schedule", "linear-decay",
                                  "--output-dir", str(tmp_path)])
    evals = [r for r in read_log(tmp_path) if r["type"] == "eval"]
    assert len(evals) == 2  # before and after training
    for r in evals:
        assert 0 <= r["heldout_avg@3"] <= r["heldout_pass@3"] <= 1
        assert r["heldout_avg@3"] * 16 * 3 == round(r["heldout_avg@3"] * 16 * 3)  # 16 problems x 3 samples
        assert r["heldout_avg@3_se"] >= 0 and r["eval_seconds"] >= 0
    # the summary: avg@k first (the paper's metric), greedy accuracy and pass@k kept beside it
    for when, r in (("start", evals[0]), ("end", evals[1])):
        for key in ("heldout_avg@3", "heldout_avg@3_se", "heldout_acc", "heldout_pass@3"):
            assert summary[f"{key}_{when}"] == r[key]
    step = next(r for r in read_log(tmp_path) if r["type"] == "train")
    assert (step["alpha_t"], step["beta_t"]) == (10.0, 1.0)  # exact: integer-valued: kappa - 1 and 1; linear-decay starts at alpha = kappa - 1


def test_evaluation_does_not_change_the_training_rollouts(tmp_path, toy_model_dir):
    """Sampled evaluation (avg@k) draws from its own RNG: the same seed gives the same rollouts,
    rewards and budgets whether or not, and how often, the run evaluates with samples. Two evaluations
    of one model also draw the same samples (common random numbers)."""
    def train_records(name, *flags):
        train.main(SMALL + ["--steps", "3", "--allocator", "coba", "--output-dir", str(tmp_path / name), *flags])
        log = read_log(tmp_path / name)
        return [(r["reward"], r["budgets"], r["group_reward"]) for r in log if r["type"] == "train"], log

    plain, _ = train_records("plain", "--eval-samples", "0")
    sampled, log = train_records("sampled", "--eval-samples", "4", "--eval-every", "1")
    assert plain == sampled
    # evaluating an unchanged model twice gives the same avg@k: --learning-rate 0 keeps the weights
    _, frozen = train_records("frozen", "--eval-samples", "4", "--learning-rate", "0")
    evals = [r for r in frozen if r["type"] == "eval"]
    assert evals[0]["heldout_avg@4"] == evals[-1]["heldout_avg@4"]


def test_no_progress_silences_every_bar(tmp_path, toy_model_dir, capfd):
    """Issue 21.4: --no-progress leaves no bar on the terminal: ours, transformers' ("Loading weights",
    "Writing model shards": the run loads the toy and saves a checkpoint) and the GGUF loader's bare
    tqdm (SmolLM2), which ignores transformers' switch; the switch is this run's only."""
    import transformers.modeling_gguf_pytorch_utils as gguf_loader

    from harness import cli
    from harness import models

    train.main(SMALL + ["--steps", "1", "--save-every", "1", "--output-dir", str(tmp_path)])
    out, err = capfd.readouterr()
    assert "it/s" not in out + err and "%|" not in out + err, err[-400:]
    # the GGUF loader's bar, as models.load_gguf runs it: off under --no-progress, on otherwise
    with cli.progress_bars(False), models.gguf_bar_follows_switch():
        list(gguf_loader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "de-quantizing" not in capfd.readouterr().err
    with cli.progress_bars(True), models.gguf_bar_follows_switch():
        list(gguf_loader.tqdm(range(3), desc="de-quantizing, bar on"))
    assert "bar on" in capfd.readouterr().err
    list(gguf_loader.tqdm(range(3), desc="de-quantizing, bar restored"))  # the module's tqdm is put back
    assert "bar restored" in capfd.readouterr().err
