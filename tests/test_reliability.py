"""What a crash, a NaN, a second run and a bad data file do to a run (issue 16).
Run: python -m pytest -q tests/test_reliability.py   (toy model, tiny runs: well under a minute)

Each test names the item of issue 16 it covers. The fault-injection test crashes save_checkpoint
after every one of its file operations in turn and checks that resume finds a complete checkpoint.
"""
import json
import math
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engines import checkpoint
from harness import data
import train
from harness import run as run_setup

SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
         "--eval-every", "0", "--no-progress", "--max-budget", "12"]


def read_log(out: Path) -> list[dict]:
    def no_nan(token):
        raise AssertionError(f"log holds {token}")  # NaN/Infinity are not JSON: the log must not hold them

    return [json.loads(line, parse_constant=no_nan) for line in (out / "log.jsonl").read_text().splitlines()]


def steps_of(out: Path) -> list[int]:
    return [r["step"] for r in read_log(out) if r["type"] == "train"]


def last_error_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------
# 1. One run per output directory
# ---------------------------------------------------------------------------------------------
def test_second_run_is_refused_naming_the_holder_and_kill_9_frees_the_dir(tmp_path, toy_model_dir):
    """A live run holds OUTPUT_DIR: a second gets one line naming its pid. Once the holder dies by
    kill -9 (no cleanup runs), the kernel has dropped the lock and the directory is usable again."""
    # The holder takes the lock as checkpoint.RunLock does (flock, then its pid), without importing torch.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, f'{os.getpid()}\\n'.encode()); print('locked', flush=True); "
         "time.sleep(120)", str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit, match=f"in use by another run \\(pid {holder.pid}\\)"):
            train.main(SMALL + ["--steps", "1", "--output-dir", str(tmp_path)])
        assert not (tmp_path / "log.jsonl").exists()  # refused before touching anything
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    train.main(SMALL + ["--steps", "1", "--output-dir", str(tmp_path)])
    assert steps_of(tmp_path) == [1]


def test_fresh_run_refuses_a_dir_with_a_run_unless_resume_or_overwrite(tmp_path, toy_model_dir, capsys):
    train.main(SMALL + ["--steps", "2", "--output-dir", str(tmp_path)])
    before = (tmp_path / "log.jsonl").read_text()
    with pytest.raises(SystemExit, match="already holds a run .*--resume.*--overwrite"):
        train.main(SMALL + ["--steps", "2", "--output-dir", str(tmp_path)])
    assert (tmp_path / "log.jsonl").read_text() == before  # the first run's log is untouched
    train.main(SMALL + ["--steps", "1", "--seed", "1", "--output-dir", str(tmp_path), "--overwrite"])
    log = read_log(tmp_path)
    assert log[0]["seed"] == 1 and steps_of(tmp_path) == [1]  # only the new run's lines
    assert [p.name for p in tmp_path.glob("checkpoint*")] == ["checkpoint-1"]
    with pytest.raises(SystemExit):
        train.main(SMALL + ["--output-dir", str(tmp_path), "--resume", "--overwrite"])
    assert "--resume" in last_error_line(capsys)


# ---------------------------------------------------------------------------------------------
# 2. A crash at any instant of a save leaves a complete checkpoint
# ---------------------------------------------------------------------------------------------
class Crash(Exception):
    pass


def test_save_crashed_after_every_file_operation_resumes_from_a_complete_checkpoint(tmp_path, toy_model_dir,
                                                                                      monkeypatch):
    """Save steps 1 and 2, then crash the step-3 save after its k-th file operation, for every k
    (it first deletes checkpoint-1, keeping checkpoint-2 until the next save: checkpoint.KEEP = 2).
    Each time the newest complete checkpoint is step 2 (weights w2) or step 3 (weights w3), it loads,
    and the next save cleans up after the crash. An exception stands in for kill -9: Crash is no
    OSError, so save_checkpoint's disk-error handling lets it through, and nothing runs after the crash point."""
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(SMALL + ["--output-dir", str(tmp_path)]), ap)
    model, tokenizer, _ = run_setup.load_model_and_tokenizer(args, torch.device("cpu"), torch.float32)
    assert model.config._attn_implementation == "sdpa"  # the toy lab's committed runs: grouped-KV attention off
    optimizer = run_setup.make_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    tracker = train.coba.CapabilityTracker(window=1, prior=0.5, gamma=10.0, kappa=11.0)
    sampler = data.PromptSampler(32, 0)
    objects = (model, tokenizer, optimizer, scheduler, tracker, sampler, args)
    first = next(model.parameters())

    def save(out, step):
        with torch.no_grad():
            first.fill_(float(step))  # w_step: tells which checkpoint a load restored
        return train.save_checkpoint(out, step, *objects, {"rollouts": 32 * step, "seconds": 0.0})

    pristine = tmp_path / "pristine"
    pristine.mkdir()
    save(pristine, 1)
    save(pristine, 2)
    assert sorted(p.name for p in pristine.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    points = []  # the file operations of a save that replaces an older checkpoint, in order
    monkeypatch.setattr(checkpoint, "_save_step_done", points.append)
    save(shutil.copytree(pristine, tmp_path / "count"), 3)
    assert points == ["unmark checkpoint-1", "delete checkpoint-1", "model", "tokenizer", "run_config",
                      "trainer_state", "sync files", "marker", "rename", "sync dir"]
    for k in range(len(points)):
        out = shutil.copytree(pristine, tmp_path / f"crash{k}")
        calls = []

        def crash_at_k(what):
            calls.append(what)
            if len(calls) == k + 1:
                raise Crash(what)

        monkeypatch.setattr(checkpoint, "_save_step_done", crash_at_k)
        with pytest.raises(Crash):
            save(out, 3)
        monkeypatch.setattr(checkpoint, "_save_step_done", lambda what: None)
        found = train.find_checkpoint(out)
        step = checkpoint.checkpoint_step(found)
        assert step == (3 if k >= points.index("rename") else 2), (k, points[k])
        with torch.no_grad():
            first.fill_(-1.0)
        loaded_step, counters = checkpoint.load_checkpoint(found, *objects[:1], *objects[2:6])
        assert loaded_step == step and counters["rollouts"] == 32 * step
        assert float(first.detach().flatten()[0]) == step  # exact: an integer written into the weight, read back
        assert train.prepare_run_dir(out, argparse_like(args, resume=True)) == found
        save(out, 4)  # the next save works and leaves the newest two checkpoints, no debris
        assert sorted(p.name for p in out.iterdir()) == [found.name, "checkpoint-4"]


def argparse_like(args, **changes):
    new = run_setup.argparse.Namespace(**vars(args))
    for key, value in changes.items():
        setattr(new, key, value)
    return new


def test_crash_between_renames_of_a_save_then_resume_continues(tmp_path, toy_model_dir, monkeypatch, capsys):
    """The issue's case end to end: the step-2 save dies at its second directory rename (old code:
    between `checkpoint -> checkpoint.old` and `checkpoint.tmp -> checkpoint`). --resume must continue
    from step 1's checkpoint, not start afresh."""
    args = SMALL + ["--steps", "3", "--save-every", "1", "--output-dir", str(tmp_path)]
    real_rename, calls = Path.rename, []

    def rename(self, target):
        calls.append(self.name)
        if len(calls) == 2:
            raise Crash("killed during a save")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(Crash):
        train.main(args)
    monkeypatch.setattr(Path, "rename", real_rename)
    capsys.readouterr()
    train.main(args + ["--resume"])
    assert f"resumed from {tmp_path / 'checkpoint-1'} at step 1" in capsys.readouterr().out
    assert steps_of(tmp_path) == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.glob("checkpoint*")) == ["checkpoint-2", "checkpoint-3"]  # KEEP = 2


# ---------------------------------------------------------------------------------------------
# 3. A NaN stops the run and never reaches a checkpoint
# ---------------------------------------------------------------------------------------------
def test_nonfinite_step_stops_and_keeps_the_last_finite_checkpoint(tmp_path, toy_model_dir, monkeypatch):
    """Step 2's loss is made NaN (injected: whether a huge --learning-rate overflows in step 1
    depends on the processor's float behaviour); its backward makes the gradients and, after the
    optimizer step, the weights NaN too. The run stops there with one line; checkpoint-1 (finite) is
    kept and nothing NaN was saved."""
    import grpo

    real_update, real_loss, updates = train.policy_update, grpo.clipped_policy_loss, []

    def nan_loss(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return loss * float("nan"), metrics

    def update(*args, **kwargs):  # train.py calls policy_update once a step
        updates.append(1)
        if len(updates) == 2:
            monkeypatch.setattr(grpo, "clipped_policy_loss", nan_loss)
        return real_update(*args, **kwargs)

    monkeypatch.setattr(train, "policy_update", update)
    with pytest.raises(SystemExit, match=r"^error: step 2 made the loss, grad_norm, weights non-finite \(NaN/inf\); "
                                         r"checkpoint-1 is finite and kept: lower --learning-rate"):
        train.main(SMALL + ["--steps", "4", "--save-every", "1", "--output-dir", str(tmp_path)])
    assert len(updates) == 2  # stopped at step 2: no step 3
    assert [p.name for p in tmp_path.glob("checkpoint*")] == ["checkpoint-1"]
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    log = read_log(tmp_path)
    assert log[-1]["type"] == "error" and log[-1]["step"] == 2
    assert log[-1]["nonfinite"] == ["loss", "grad_norm", "weights"]
    assert [r["step"] for r in log if r["type"] == "train"] == [1]  # step 2 was never logged as trained


# ---------------------------------------------------------------------------------------------
# 4. Resume checks the flags, never repeats a finished run's end, survives a torn log line
# ---------------------------------------------------------------------------------------------
def test_resume_refuses_changed_flags_in_one_line(tmp_path, toy_model_dir, capsys):
    train.main(SMALL + ["--steps", "2", "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="flags differ from the saved run: --learning-rate 0.0002 -> 0.001, "
                                         "--seed 0 -> 1 "):
        train.main(SMALL + ["--steps", "4", "--learning-rate", "1e-3", "--seed", "1", "--no-progress",
                            "--output-dir", str(tmp_path), "--resume"])
    with pytest.raises(SystemExit, match="--allocator coba -> uniform"):
        train.main(SMALL + ["--steps", "4", "--allocator", "uniform", "--output-dir", str(tmp_path), "--resume"])
    assert steps_of(tmp_path) == [1, 2]


def test_resuming_a_finished_run_adds_nothing_and_larger_steps_extend_it(tmp_path, toy_model_dir):
    args = SMALL + ["--output-dir", str(tmp_path), "--save-every", "100"]
    first = train.main(args + ["--steps", "2"])
    log = (tmp_path / "log.jsonl").read_text()
    assert train.main(args + ["--steps", "2", "--resume"]) == first
    assert (tmp_path / "log.jsonl").read_text() == log  # no second final eval or summary
    train.main(args + ["--steps", "3", "--resume"])
    records = read_log(tmp_path)
    assert steps_of(tmp_path) == [1, 2, 3]
    assert [r["step"] for r in records if r["type"] == "summary"] == [3]  # the old summary is gone
    assert [r["step"] for r in records if r["type"] == "eval"] == [0, 2, 3]


def test_torn_last_log_line_does_not_break_resume(tmp_path, toy_model_dir):
    args = SMALL + ["--output-dir", str(tmp_path), "--save-every", "1"]
    train.main(args + ["--steps", "2"])
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["type"] != "summary"]  # killed mid-way ...
    (tmp_path / "log.jsonl").write_text("\n".join(kept) + '\n{"type": "summary", "st')  # ... through a line
    summary = train.main(args + ["--steps", "3", "--resume"])
    assert summary["type"] == "summary" and steps_of(tmp_path) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# 7. Every numeric flag has a range; a violation is one line naming flag and range
# ---------------------------------------------------------------------------------------------
BAD_FLAGS = [("--warmup-lr-steps", "-5", "[0, inf)"), ("--max-grad-norm", "-1", "(0, inf)"),
             ("--save-every", "0", "[1, inf)"), ("--prompts-per-step", "0", "[1, inf)"),
             ("--micro-batch-size", "0", "[1, inf)"), ("--generation-batch-size", "0", "[1, inf)"),
             ("--temperature", "0", "(0, inf)"), ("--max-completion-length", "0", "[1, inf)"),
             ("--threads", "-1", "[1, inf)"), ("--learning-rate", "nan", "[0, inf)"),
             ("--top-p", "1.5", "(0, 1]"), ("--epsilon", "1", "[0, 1)"), ("--max-prompt-length", "0", "[1, inf)")]


@pytest.mark.parametrize("flag, value, interval", BAD_FLAGS)
def test_out_of_range_flag_is_a_one_line_error(tmp_path, flag, value, interval, capsys):
    with pytest.raises(SystemExit):
        train.main(SMALL + ["--steps", "1", "--output-dir", str(tmp_path), flag, value])
    assert f"error: {flag} must be in {interval}, got " in last_error_line(capsys)
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(SMALL + ["--steps", "1", "--output-dir", str(tmp_path), "--device", "cuda"])
    assert "--device cuda: no CUDA device here" in last_error_line(capsys)


# ---------------------------------------------------------------------------------------------
# 8. Data files: every row checked, file:line in errors, BOM, .json layouts, a prompt-length cap
# ---------------------------------------------------------------------------------------------
def data_args(path: Path, *extra: str):
    ap = train.build_parser()
    return train.resolve_args(ap.parse_args(["--dataset", str(path), "--eval-size", "2", "--prompts-per-step",
                                             "2", *extra]), ap)


def test_rows_without_a_usable_question_or_answer_are_skipped_and_counted_or_refused(tmp_path):
    rows = [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": 4},
            {"question": "3+3="},  # line 3: no answer field
            {"question": None, "answer": "8"},  # line 4: null, which str() would make the question "None"
            {"question": "  ", "answer": "10"}, [1, 2]]  # line 5: empty question; line 6: not an object
    rows += [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(7, 17)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = {}
    train_set, evals = run_setup.load_data(data_args(path), counts)
    assert counts == {"skipped_rows": 4}
    records = train_set + evals["heldout"]
    assert len(records) == 16 - 4 and all(r["question"].strip() and r["question"] != "None" for r in records)
    assert {"question": "2+2=", "answer": "4"} in records  # a numeric answer is fine
    with pytest.raises(SystemExit, match=f"error: {path}:3: no usable 'answer'.*--bad-rows skip"):
        run_setup.load_data(data_args(path, "--bad-rows", "error"))


def test_data_file_errors_name_file_and_line(tmp_path):
    good = [json.dumps({"question": f"{a}+1=", "answer": str(a + 1)}) for a in range(12)]
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text("\n".join(good[:3] + ['{"question": "4+1=", "answer": "5"'] + good[3:]) + "\n")
    with pytest.raises(SystemExit, match=f"error: {bad_json}:4: not valid JSON"):
        run_setup.load_data(data_args(bad_json))
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes("\n".join(good[:1] + ['{"question": "caf\xe9 1+1=", "answer": "2"}'] + good[1:]).encode("latin-1"))
    with pytest.raises(SystemExit, match=f"error: {latin1}:2: byte 0xe9 is not UTF-8"):
        run_setup.load_data(data_args(latin1))


def test_bom_and_json_layouts_load(tmp_path):
    rows = [{"question": f"{a}+1=", "answer": str(a + 1)} for a in range(10)]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"version": 1, "data": rows}, indent=2))  # pretty-printed object
    array = tmp_path / "array.json"
    array.write_text(json.dumps(rows, indent=2))
    for path in (bom, nested, array):
        train_set, evals = run_setup.load_data(data_args(path))
        assert sorted(r["question"] for r in train_set + evals["heldout"]) == sorted(r["question"] for r in rows)
    one = tmp_path / "one.json"
    one.write_text(json.dumps(rows[0], indent=2))  # a single problem, pretty-printed
    assert data.read_local(str(one), "question", "answer") == [{"question": "0+1=", "answer": "1"}]


def test_long_prompts_are_skipped_and_counted_without_tokenising_them(tmp_path, toy_model_dir):
    """A 5 MB question is dropped by its length in characters: the tokenizer never sees more than
    32 * L characters (natural text has ~4 a token), so memory stays bounded."""
    ap = train.build_parser()
    args = train.resolve_args(ap.parse_args(["--model", "toy", "--max-prompt-length", "16"]), ap)
    _, tokenizer, _ = run_setup.load_model_and_tokenizer(args, torch.device("cpu"), torch.float32)
    seen = []

    def spy(texts, **kw):
        seen.extend(texts)
        return tokenizer_call(texts, **kw)

    tokenizer_call = tokenizer.__call__
    records = [{"question": "12+34=", "answer": "46"}, {"question": "1" * 5_000_000, "answer": "1"},
               {"question": "1+" * 40 + "1=", "answer": "41"}]  # 83 characters: over 16 tokens
    kept, dropped = data.drop_long_prompts(records, spy, args)
    assert kept == records[:1] and dropped == 2
    assert max(len(t) for t in seen) <= 32 * 16


def test_long_prompt_in_a_run_is_counted_in_the_config_line(tmp_path, toy_model_dir):
    path = tmp_path / "arith.jsonl"
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(20)]
    rows[5]["question"] = "9" * 1_000_000 + "+1="
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    train.main(["--model", "toy", "--dataset", str(path), "--eval-size", "4", "--prompts-per-step", "4", "--num-generations", "2",
                "--max-prompt-length", "64", "--steps", "1", "--no-progress", "--output-dir", str(out)])
    config = read_log(out)[0]  # 20 rows, 4 held out, the long one dropped from whichever side it fell on
    assert config["skipped_long_prompts"] == 1 and config["train_size"] in (15, 16)


# ---------------------------------------------------------------------------------------------
# 9. An empty eval set writes no NaN
# ---------------------------------------------------------------------------------------------
def test_empty_eval_sets_write_no_nan(tmp_path, toy_model_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"question": None, "answer": "1"}) + "\n")  # its only row is unusable
    summary = train.main(SMALL + ["--steps", "1", "--eval-size", "0", "--eval-files", str(empty),
                                  "--output-dir", str(tmp_path / "run")])
    evals = [r for r in read_log(tmp_path / "run") if r["type"] == "eval"]  # read_log fails on NaN
    assert [sorted(r) for r in evals] == [["eval_seconds", "rollouts", "step", "type"]] * 2
    assert summary["heldout_acc_start"] is None and summary["heldout_acc_end"] is None


# ---------------------------------------------------------------------------------------------
# 12. A small local file: the held-out slice is capped, not the whole file
# ---------------------------------------------------------------------------------------------
def test_held_out_slice_of_a_small_file_is_capped_at_a_fifth(tmp_path, capsys):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"question": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(40)))
    ap = train.build_parser()
    # the hub preset's --eval-size is 500: it used to take all 40 problems, leaving none to train on
    args = train.resolve_args(ap.parse_args(["--model", "smollm2-135m", "--dataset", str(path),
                                             "--prompts-per-step", "4"]), ap)
    assert args.eval_size == 500
    train_set, evals = run_setup.load_data(args)
    assert (len(train_set), len(evals["heldout"])) == (32, 8)  # 40 // 5 = 8 held out
    assert "holding out 8 (a fifth)" in capsys.readouterr().err
    args.prompts_per_step = 33
    with pytest.raises(SystemExit, match=r"32 training problems \(8 more held out by --eval-size\) < "
                                         r"--prompts-per-step 33: lower --prompts-per-step or --eval-size"):
        run_setup.load_data(args)


def test_log_and_summary_are_finite_numbers(tmp_path, toy_model_dir):
    """Sanity for the items above: a normal short run writes only finite numbers."""
    train.main(SMALL + ["--steps", "1", "--output-dir", str(tmp_path)])
    for record in read_log(tmp_path):
        for value in record.values():
            if isinstance(value, float):
                assert math.isfinite(value)
