"""What a run deletes, what stops it, and what --resume checks (issue 25).
Run: python -m pytest -q tests/test_safety.py   (toy model, tiny runs)

Each test names the case of issue 25 it covers: a save or --overwrite deletes only its own
checkpoint-<digits> directories (1); SIGTERM is a graceful stop (3) with exit 143, Ctrl-C 130 (10);
--overwrite deletes only after setup succeeded (4); a damaged newest checkpoint falls back to the
previous one (5); a full disk is one line and leaves no debris (6); --resume refuses changed data or
model (8, and the model); bad --prompt-template and clashing eval names are one-line errors (9).
Faults are injected deterministically (monkeypatch, file edits); the one subprocess test polls its
log with a generous deadline, never a timing assumption.
"""
import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engines import checkpoint
from harness import data
from harness import models
import train

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
         "--eval-every", "0", "--no-progress", "--max-budget", "12"]


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def steps_of(out: Path) -> list[int]:
    return [r["step"] for r in read_log(out) if r["type"] == "train"]


def names(out: Path) -> list[str]:
    """What is in a run dir beside the run's own files (its log, lock, sample completions, plots)."""
    return sorted(p.name for p in out.iterdir() if p.name not in (".lock", "log.jsonl", "completions.jsonl", "plots"))


def refusal(argv: list[str]) -> str:
    """The one line train.main stops with (SystemExit's message), checked to be one line."""
    with pytest.raises(SystemExit) as exc:
        train.main(argv)
    line = str(exc.value.code)
    assert line.startswith("error: ") and "\n" not in line
    return line


def problems_file(path: Path, n: int = 40, offset: int = 0) -> Path:
    path.write_text("".join(json.dumps({"question": f"{a}+{offset + 1}=", "answer": str(a + offset + 1)}) + "\n"
                            for a in range(n)))
    return path


# ---------------------------------------------------------------------------------------------
# 1. A save and --overwrite delete only checkpoint-<digits> (and their .tmp)
# ---------------------------------------------------------------------------------------------
def test_save_and_overwrite_keep_what_is_not_theirs(tmp_path, toy_model_dir):
    user = {"checkpoint-4.bak": "dir", "checkpoint-best": "dir", "checkpoints_notes": "dir",
            "checkpoint-notes.txt": "file", "checkpoint-7.tmp.keep": "dir"}
    for name, kind in user.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "mine.txt").write_text("do not delete")
        else:
            (tmp_path / name).write_text("do not delete")
    # none of these is a run: a fresh run starts here, and its saves leave them alone
    train.main(SMALL + ["--steps", "3", "--save-every", "1", "--output-dir", str(tmp_path)])
    assert names(tmp_path) == sorted(["checkpoint-2", "checkpoint-3", *user])
    train.main(SMALL + ["--steps", "1", "--seed", "1", "--output-dir", str(tmp_path), "--overwrite"])
    assert names(tmp_path) == sorted(["checkpoint-1", *user])
    assert steps_of(tmp_path) == [1] and read_log(tmp_path)[0]["seed"] == 1
    assert all((tmp_path / n / "mine.txt").exists() for n, kind in user.items() if kind == "dir")


# ---------------------------------------------------------------------------------------------
# 3 + 10. SIGTERM finishes the step, checkpoints, exits 143; Ctrl-C exits 130
# ---------------------------------------------------------------------------------------------
def test_sigterm_finishes_the_step_checkpoints_and_exits_143(tmp_path, toy_model_dir):
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), *SMALL, "--steps", "100000", "--save-every", "100000",
           "--output-dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # a generous bound on a loaded machine, not a timing assumption
        while not (out / "log.jsonl").exists() or '"type": "train"' not in (out / "log.jsonl").read_text():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no training step logged"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM: finishing this step, then saving a checkpoint" in err
    done = steps_of(out)
    assert done == list(range(1, len(done) + 1)) and done
    assert checkpoint.find_checkpoint(out).name == f"checkpoint-{done[-1]}"
    train.main(SMALL + ["--steps", str(done[-1] + 1), "--output-dir", str(out), "--resume"])
    assert steps_of(out) == list(range(1, done[-1] + 2))


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_exits_128_plus_signal_after_its_checkpoint(tmp_path, toy_model_dir, monkeypatch,
                                                                    signum, code):
    real_step = train.rl_step

    def step_then_signal(run, step):
        record = real_step(run, step)
        if step == 0:
            signal.raise_signal(signum)  # the handler sets the flag; the loop then saves and stops
        return record

    monkeypatch.setattr(train, "rl_step", step_then_signal)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit) as exc:
        train.main(SMALL + ["--steps", "4", "--save-every", "100", "--output-dir", str(tmp_path)])
    assert exc.value.code == code
    assert steps_of(tmp_path) == [1] and checkpoint.find_checkpoint(tmp_path).name == "checkpoint-1"
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # put back as they were


# ---------------------------------------------------------------------------------------------
# 4. --overwrite deletes the old run only once the new run's data and model have loaded
# ---------------------------------------------------------------------------------------------
def test_overwrite_with_a_typo_keeps_the_old_run(tmp_path, toy_model_dir):
    out = tmp_path / "run"
    train.main(SMALL + ["--steps", "1", "--output-dir", str(out)])
    before = {p.name: p.stat().st_size for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match="does not exist"):
        train.main(SMALL + ["--steps", "1", "--output-dir", str(out), "--overwrite",
                            "--dataset", str(tmp_path / "typo.jsonl")])
    with pytest.raises(SystemExit, match="cannot load model"):
        train.main(SMALL + ["--steps", "1", "--output-dir", str(out), "--overwrite", "--model",
                            str(tmp_path / "no-such-model"), "--max-completion-length", "8"])
    assert {p.name: p.stat().st_size for p in out.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------------------------------------
# 5. A damaged newest checkpoint: fall back to the previous one, with a warning; never delete it
# ---------------------------------------------------------------------------------------------
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, toy_model_dir, capsys):
    args = SMALL + ["--save-every", "1", "--output-dir", str(tmp_path)]
    train.main(args + ["--steps", "3"])
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-3"]  # the previous one is kept
    marker = json.loads((tmp_path / "checkpoint-3" / "COMPLETE").read_text())
    assert marker["step"] == 3 and marker["files"]["model.safetensors"] > 0
    weights = tmp_path / "checkpoint-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated: the marker's size tells
    capsys.readouterr()
    train.main(args + ["--steps", "4", "--resume"])
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if "checkpoint-3" in line]
    assert len(warning) == 1 and "damaged" in warning[0] and "model.safetensors" in warning[0]
    assert "checkpoint-3.damaged" in warning[0] and "checkpoint-2" in warning[0]
    assert f"resumed from {tmp_path / 'checkpoint-2'} at step 2" in captured.out
    assert steps_of(tmp_path) == [1, 2, 3, 4]
    assert names(tmp_path) == ["checkpoint-3", "checkpoint-3.damaged", "checkpoint-4"]
    assert (tmp_path / "checkpoint-3.damaged" / "model.safetensors").stat().st_size == 1000  # kept as found


def test_checkpoint_that_fails_to_load_falls_back_and_all_damaged_refuses(tmp_path, toy_model_dir, capsys):
    args = SMALL + ["--save-every", "1", "--output-dir", str(tmp_path)]
    train.main(args + ["--steps", "2"])
    state = tmp_path / "checkpoint-2" / "trainer_state.pt"
    raw = bytearray(state.read_bytes())
    raw[-64:] = bytes(64)  # same size, the zip archive's directory gone: only loading tells
    state.write_bytes(bytes(raw))
    capsys.readouterr()
    train.main(args + ["--steps", "3", "--resume"])
    assert "warning: checkpoint-2 is damaged (trainer_state.pt" in capsys.readouterr().err
    assert steps_of(tmp_path) == [1, 2, 3]
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-2.damaged", "checkpoint-3"]
    for name in ("checkpoint-2", "checkpoint-3"):  # now every complete checkpoint is damaged
        (tmp_path / name / "trainer_state.pt").write_bytes(b"")
    listing = names(tmp_path)
    line = refusal(args + ["--steps", "4", "--resume"])
    assert line.startswith(f"error: no checkpoint in {tmp_path} loads") and "--overwrite" in line
    assert names(tmp_path) == listing  # nothing renamed or deleted when nothing loads


# ---------------------------------------------------------------------------------------------
# 6. A full disk: one line, the .tmp removed, room needed stated; --resume cleans stale .tmp
# ---------------------------------------------------------------------------------------------
def test_disk_full_during_a_save_is_one_line_and_leaves_no_tmp(tmp_path, toy_model_dir, monkeypatch, capsys):
    args = SMALL + ["--save-every", "1", "--output-dir", str(tmp_path)]
    real_save, calls = torch.save, []

    def save_on_a_full_disk(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the step-2 save: the step-1 checkpoint exists
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*a, **kw)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    line = refusal(args + ["--steps", "3"])
    monkeypatch.setattr(torch, "save", real_save)
    assert line.startswith(f"error: cannot save checkpoint-2 in {tmp_path}: the disk is full")
    assert "room for 2 checkpoints of about" in line and "--resume" in line
    assert names(tmp_path) == ["checkpoint-1"]
    # a RuntimeError from the writer ("unexpected pos ...") on a disk with nothing free: the same
    monkeypatch.setattr(checkpoint, "_free_bytes", lambda path: 0)

    def torn_write(self, *a, **kw):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 4352 vs 4246")

    from transformers import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", torn_write)
    (tmp_path / "checkpoint-9.tmp").mkdir()  # a stale one a killed save left: --resume removes it
    (tmp_path / "checkpoint-9.tmp" / "model.safetensors").write_bytes(b"half")
    line = refusal(args + ["--steps", "3", "--resume"])
    assert "cannot save checkpoint-2" in line and "the disk is full (0 bytes free)" in line
    assert names(tmp_path) == ["checkpoint-1"]
    monkeypatch.undo()
    train.main(args + ["--steps", "3", "--resume"])
    assert steps_of(tmp_path) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# 8. --resume refuses changed data; a local file's held-out slice does not depend on --seed
# ---------------------------------------------------------------------------------------------
def test_resume_refuses_when_the_data_file_or_an_eval_file_changed(tmp_path, toy_model_dir, capsys):
    path, bench = problems_file(tmp_path / "p.jsonl"), problems_file(tmp_path / "bench.jsonl", 10, 5)
    out = tmp_path / "run"
    args = ["--model", "toy", "--dataset", str(path), "--eval-files", str(bench), "--eval-size", "8", "--prompts-per-step", "4",
            "--num-generations", "2", "--no-progress", "--save-every", "1", "--output-dir", str(out)]
    train.main(args + ["--steps", "1"])
    config = read_log(out)[0]
    assert config["data_identity"]["file"]["sha256"] == data.file_sha256(path)
    assert [f["file"] for f in config["data_identity"]["eval_files"]] == [str(bench)]
    problems_file(path, 41)  # one problem more
    line = refusal(args + ["--steps", "2", "--resume"])
    assert f"cannot resume {out / 'checkpoint-1'}: {path} changed since the saved run" in line
    assert "restore it" in line and "--overwrite" in line
    problems_file(path)  # restored: resumes
    problems_file(bench, 10, 6)  # same size, other answers
    assert f"{bench} changed since the saved run" in refusal(args + ["--steps", "2", "--resume"])
    problems_file(bench, 10, 5)
    train.main(args + ["--steps", "2", "--resume"])
    assert steps_of(out) == [1, 2]


def test_held_out_slice_of_a_local_file_is_the_same_for_every_seed(tmp_path):
    path = problems_file(tmp_path / "p.jsonl")
    ap = train.build_parser()
    held = []
    for seed in ("0", "1"):
        args = train.resolve_args(ap.parse_args(["--dataset", str(path), "--eval-size", "8", "--prompts-per-step",
                                                 "4", "--seed", seed]), ap)
        train_set, evals = data.load_data(args)
        held.append(evals["heldout"])
        assert len(evals["heldout"]) == 8 and not {r["question"] for r in evals["heldout"]} & \
            {r["question"] for r in train_set}
    assert held[0] == held[1]


# ---------------------------------------------------------------------------------------------
# The model: --resume refuses another base model (config or tokenizer), warns on other weights
# ---------------------------------------------------------------------------------------------
def test_model_identity_tracks_config_tokenizer_and_weights(tmp_path, toy_model_dir):
    import shutil

    local = Path(shutil.copytree(toy_model_dir, tmp_path / "model"))
    base = models.model_identity(str(local))
    assert base == models.model_identity(str(local)) and base["weights_bytes"] > 0
    weights = local / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 1
    weights.write_bytes(bytes(raw))
    changed = models.model_identity(str(local))
    assert changed["weights_sha256"] != base["weights_sha256"] and changed["config_sha256"] == base["config_sha256"]
    (local / "config.json").write_text((local / "config.json").read_text().replace("}", ', "x": 1}', 1))
    assert models.model_identity(str(local))["config_sha256"] != base["config_sha256"]
    assert models.model_identity("Qwen/Qwen2.5-1.5B") == {"path": "Qwen/Qwen2.5-1.5B"}  # hub id: its name


def test_resume_refuses_another_base_model(tmp_path, toy_model_dir, capsys):
    args = SMALL + ["--save-every", "1", "--output-dir", str(tmp_path)]
    train.main(args + ["--steps", "1"])
    config = read_log(tmp_path)[0]
    assert config["model_identity"]["config_sha256"] and config["bf16"] is False  # recorded as run
    saved = tmp_path / "checkpoint-1" / "run_config.json"
    record = json.loads(saved.read_text())
    record["model_identity"]["tokenizer_sha256"] = "0" * 64  # as if the base model's tokenizer had changed
    saved.write_text(json.dumps(record))
    line = refusal(args + ["--steps", "2", "--resume"])
    assert "cannot resume" in line and "the model's tokenizer differs from the saved run's" in line


# ---------------------------------------------------------------------------------------------
# 9. A template without {question}, and eval sets of one name, are one-line errors
# ---------------------------------------------------------------------------------------------
def test_prompt_template_without_question_is_a_one_line_error(tmp_path):
    line = refusal(SMALL + ["--steps", "1", "--prompt-template", "Solve: {q}", "--output-dir", str(tmp_path)])
    assert line.startswith("error: --prompt-template 'Solve: {q}' has no {question}")
    assert not (tmp_path / "log.jsonl").exists()


def test_eval_files_with_one_name_are_a_one_line_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = problems_file(tmp_path / "a" / "test.jsonl", 5), problems_file(tmp_path / "b" / "test.jsonl", 6)
    held = problems_file(tmp_path / "heldout.jsonl", 5)
    ap = train.build_parser()
    for files, message in (([one, two], f"--eval-files {one} and {two} are both named 'test'"),
                           ([held], f"--eval-files {held} is named 'heldout'")):
        args = train.resolve_args(ap.parse_args(["--eval-files", *map(str, files)]), ap)
        with pytest.raises(SystemExit, match=message + ".*rename"):
            data.load_data(args)


# ---------------------------------------------------------------------------------------------
# A resumed run records the flags it changed
# ---------------------------------------------------------------------------------------------
def test_resume_logs_the_flags_that_changed(tmp_path, toy_model_dir):
    args = SMALL + ["--save-every", "1", "--output-dir", str(tmp_path)]
    train.main(args + ["--steps", "1"])
    train.main(args + ["--steps", "2", "--micro-batch-size", "7", "--resume"])
    resume = [r for r in read_log(tmp_path) if r["type"] == "resume"]
    assert resume == [{"type": "resume", "step": 1, "checkpoint": "checkpoint-1",
                       "changed": {"micro_batch_size": [512, 7], "steps": [1, 2]}}]
