"""Watching a run: --report-to (TensorBoard, wandb), sample completions, a run's own plots.
Run: python -m pytest -q tests/test_watch.py

One small toy run (M = 8 prompts, G = 4, a 16-problem pool revisited from step 3, so steps 3-4 have
unequal budgets) is shared by the tests that read what a run wrote.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines import tracking
import train
import verify

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "16", "--eval-size", "16",
         "--eval-every", "2", "--eval-samples", "2", "--no-progress", "--max-budget", "12"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def tb_events(log_dir: Path):
    """TensorBoard's own reader, everything kept (size_guidance 0 = no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory, toy_model_dir):
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("watch") / "run"
    train.main(SMALL + ["--steps", "4", "--report-to", "tensorboard", "--log-completions", "4",
                        "--output-dir", str(out)])
    return out


def test_tensorboard_has_the_logs_scalars(tb_run):
    """Every scalar of every train and eval record reaches TensorBoard under its name, at its step,
    with its value; the per-prompt vectors are histograms; the sample rows are text."""
    log = read_jsonl(tb_run / "log.jsonl")
    acc = tb_events(tb_run / tracking.TB_DIR)
    expected = {}  # tracker name -> {step: value}
    for r in log:
        if r["type"] in ("train", "eval"):
            for name, value in tracking.scalars(r).items():
                expected.setdefault(name, {})[r["step"]] = value
    assert {"train/reward", "train/reward_std", "train/frac_reward_zero_std", "train/completions/mean_length",
            "train/kl", "train/clip_ratio", "train/grad_norm", "train/learning_rate", "train/coba/alpha_t",
            "eval/heldout_acc", "eval/heldout_avg@2", "eval/heldout_pass@2"} <= set(expected)
    assert set(acc.Tags()["scalars"]) == set(expected)
    for name, by_step in expected.items():
        got = {e.step: e.value for e in acc.Scalars(name)}
        assert set(got) == set(by_step), name
        for step, value in by_step.items():  # TensorBoard stores float32
            assert got[step] == pytest.approx(value, rel=1e-6, abs=1e-7), (name, step)
    assert [e.step for e in acc.Scalars("eval/heldout_acc")] == [0, 2, 4]
    for name in tracking.HISTOGRAMS.values():
        assert [e.step for e in acc.Histograms(name)] == [1, 2, 3, 4]
    budgets = acc.Histograms("train/coba/budgets")[-1].histogram_value
    assert budgets.num == 8 and budgets.sum == 32  # M prompts, B_total = M * G
    assert len(acc.Tensors("completions/text_summary")) == 4


def test_completions_match_the_runs_rewards(tb_run):
    """Each sample row's reward is the verifier's on its completion; its B_i and p_i are the log's;
    each step shows its largest- and its smallest-budget prompt."""
    log = {r["step"]: r for r in read_jsonl(tb_run / "log.jsonl") if r["type"] == "train"}
    rows = read_jsonl(tb_run / tracking.COMPLETIONS)
    assert sorted({r["step"] for r in rows}) == [1, 2, 3, 4]
    for step, rec in log.items():
        mine = [r for r in rows if r["step"] == step]
        assert len(mine) == 4 and len({r["prompt_idx"] for r in mine}) == 4
        budgets = [r["B_i"] for r in mine]
        assert max(budgets) == max(rec["budgets"]) and min(budgets) == min(rec["budgets"])
        for r in mine:
            i = rec["prompt_idx"].index(r["prompt_idx"])
            assert r["B_i"] == rec["budgets"][i] and r["p_i"] == rec["pass_rates"][i]
            assert r["reward"] == verify.reward(r["completion"], r["answer"], last_number_fallback=True)
            assert len(r["prompt"]) <= tracking.MAX_CHARS and len(r["completion"]) <= tracking.MAX_CHARS
    assert any(len(set(rec["budgets"])) > 1 for rec in log.values()), "no step had unequal budgets"
    assert {r["reward"] for r in rows} == {0.0, 1.0}  # exact: 0/1 rewards; both kinds shown


def test_plots_from_a_run_directory_alone(tb_run, tmp_path):
    """`python plots.py DIR` draws every figure from a copy of the run directory, nothing else."""
    from matplotlib.image import imread

    copy = tmp_path / "copied"
    shutil.copytree(tb_run, copy)
    shutil.rmtree(copy / "plots")
    proc = subprocess.run([sys.executable, str(ROOT / "plots.py"), str(copy)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (copy / "plots").glob("*.png"))
    assert names == ["accuracy_reward.png", "budget_vs_pass_rate.png", "capability.png",
                     "preference_density.png", "zero_signal.png"]
    assert sorted(p.name for p in (tb_run / "plots").glob("*.png")) == names  # the run drew them too
    for name in names:
        img = imread(copy / "plots" / name)  # (H, W, 4) floats in [0, 1]
        assert img.shape[0] > 200 and img.shape[1] > 300
        # non-trivial: a good share of pixels are not background white (axes, lines, text)
        assert np.mean(img[..., :3].min(axis=2) < 0.9) > 0.01, name


def test_plots_refuse_a_directory_without_a_log(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "plots.py"), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'log.jsonl'} not found: pass a run directory (train.py --output-dir)"]


def test_resume_continues_the_tensorboard_run_and_completions(tmp_path, toy_model_dir):
    """--resume from checkpoint-2 after a crash that had logged past it (steps 3-5): TensorBoard
    drops those events (purge), completions.jsonl is cut back like the log; the resumed steps
    then appear once, with the log's values."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    out = tmp_path / "run"
    flags = SMALL + ["--eval-every", "0", "--report-to", "tensorboard", "--output-dir", str(out)]
    train.main(flags + ["--steps", "2"])
    crashed = SummaryWriter(str(out / tracking.TB_DIR))  # what the lost steps had written
    for step in (3, 4, 5):
        crashed.add_scalar("train/reward", 99.0, step)
    crashed.close()
    with (out / tracking.COMPLETIONS).open("a") as f:
        f.write(json.dumps({"step": 3, "prompt_idx": -1, "completion": "lost"}) + "\n")
    train.main(flags + ["--steps", "4", "--resume"])
    log = [r for r in read_jsonl(out / "log.jsonl") if r["type"] == "train"]
    got = [(e.step, e.value) for e in tb_events(out / tracking.TB_DIR).Scalars("train/reward")]
    assert [s for s, _ in got] == [1, 2, 3, 4]
    assert [v for _, v in got] == pytest.approx([r["reward"] for r in log], rel=1e-6)
    rows = read_jsonl(out / tracking.COMPLETIONS)
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3, 4) for _ in range(4)]
    assert all(r["prompt_idx"] >= 0 for r in rows)


def test_pick_groups_takes_both_ends():
    budgets = [2, 10, 4, 32, 2, 6]
    assert tracking.pick_groups(budgets, 4) == [3, 4, 1, 0]  # 32, 2 (last of the ties), 10, 2
    assert tracking.pick_groups(budgets, 1) == [3]
    assert sorted(tracking.pick_groups(budgets, 99)) == list(range(6))  # at most one row per prompt
    assert tracking.pick_groups(budgets, 0) == []


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_missing_tracker_is_a_one_line_error(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(SystemExit) as e:
        tracking.Tracker(name, tmp_path)
    assert str(e.value) == (f"error: --report-to {name} needs the {name} package: pip install {name} "
                            "(or --report-to none)")


class FakeWandb:
    """Records what tracking.Tracker hands to wandb (CI has no wandb; the real one is tested below)."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0
        self.Histogram = lambda values: ("hist", list(values))
        self.Table = lambda columns, data: ("table", columns, data)

    def init(self, **kw):
        self.inits.append(kw)
        return self

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished += 1


TRAIN = {"type": "train", "step": 3, "rollouts": 96, "reward": 0.25, "lr": 2e-4, "clip_frac": 0.1,
         "budgets": [2, 6], "pass_rates": [0.0, 0.5], "group_reward": [0.0, 0.5], "prompt_idx": [4, 7],
         "seen": 2, "F_t": 0.75, "loss": float("nan")}


def test_wandb_gets_trl_names_and_resumes_the_same_run(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    t = tracking.Tracker("wandb", tmp_path, 0, {"seed": 0})
    t.log({"type": "config", "step": -1, "seed": 0})
    t.log(TRAIN)
    t.log({"type": "eval", "step": 3, "rollouts": 96, "heldout_acc": 0.5, "heldout_avg@4": 0.4})
    t.log_completions([{"step": 3, "prompt": "1+1=", "completion": "2", "reward": 1.0, "B_i": 6, "p_i": 0.5}])
    t.close()
    t.close()  # idempotent (atexit calls it again)
    assert fake.finished == 1
    init = fake.inits[0]
    assert init["mode"] == "offline" and init["resume"] == "allow" and init["dir"] == str(tmp_path)
    assert init["id"] == (tmp_path / tracking.WANDB_ID).read_text().strip()
    step, values = fake.logged[0]
    assert step == 3 and values == {  # exact: the values logged, passed through; a NaN loss is left out; step and vectors are not scalars
        "train/rollouts": 96.0, "train/reward": 0.25, "train/learning_rate": 2e-4, "train/clip_ratio": 0.1,
        "train/coba/seen": 2.0, "train/coba/F_t": 0.75, "train/coba/budgets": ("hist", [2, 6]),
        "train/coba/pass_rates": ("hist", [0.0, 0.5]), "train/group_reward": ("hist", [0.0, 0.5])}
    assert fake.logged[1] == (3, {"eval/rollouts": 96.0, "eval/heldout_acc": 0.5, "eval/heldout_avg@4": 0.4})  # exact: the values logged, passed through
    assert fake.logged[2][1]["completions"] == ("table", ["step", "prompt", "completion", "reward", "B_i", "p_i"],  # exact: the values logged, passed through
                                                [[3, "1+1=", "2", 1.0, 6, 0.5]])
    tracking.Tracker("wandb", tmp_path, 3, {"seed": 0}).close()  # --resume from step 3: the same run
    assert fake.inits[1]["id"] == init["id"]
    tracking.Tracker("wandb", tmp_path, 0, {"seed": 0}).close()  # a fresh run (--overwrite): a new one
    assert fake.inits[2]["id"] != init["id"]


def test_real_wandb_offline(tmp_path, monkeypatch):
    """The real package, offline (no network here): the run, its id and the sample table on disk."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = tracking.Tracker("wandb", tmp_path, 0, {"seed": 0})
    t.log(TRAIN)
    t.log_completions([{"step": 3, "prompt": "1+1=", "completion": "2", "reward": 1.0, "B_i": 6, "p_i": 0.5}])
    t.close()
    run_id = (tmp_path / tracking.WANDB_ID).read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and (runs[0] / f"run-{run_id}.wandb").stat().st_size > 0
    tables = list(runs[0].glob("files/media/table/completions_*.table.json"))
    assert len(tables) == 1 and json.loads(tables[0].read_text())["data"] == [[3, "1+1=", "2", 1.0, 6, 0.5]]  # exact: the values logged, written and read back
