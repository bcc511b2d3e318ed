"""The experiment script (issue 12) in its --quick form, and its statistics by hand.
Run: python -m pytest -q tests/test_compare.py"""
import json
import math
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compare
from harness import stats


def test_quick_compare_writes_results_plots_and_resumes(tmp_path, toy_model_dir):
    arms = ["uniform", "coba", "coba+probe"]
    res = compare.main(["--quick", "--arms", *arms, "--seeds", "0", "1", "--out", str(tmp_path)])
    table_dir = tmp_path / "quick"
    lines = [json.loads(l) for l in (table_dir / "compare.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "config" and lines[1:] == res["summary"] + res["paired"]
    runs = res["runs"]
    assert len(runs) == 3 * 2 and {r["arm"] for r in runs} == set(arms)
    for r in runs:
        # equal budget: every arm consumed exactly steps * M * G = 6 * 8 * 4 rollouts (the probe too)
        assert r["total_rollouts"] == 6 * 32 and r["rollouts"][-1] == 6 * 32
        assert len(r["acc"]) == len(r["rollouts"]) == 3 and all(0 <= a <= 1 for a in r["acc"])
        assert 0 <= r["zero_signal_group_share"] <= 1
        # issue 19: the primary metric is avg@8 (T 1.0, top-p 0.9); greedy and pass@8 ride along.
        # Per problem the mean of 8 samples is <= their max, so avg@8 <= pass@8 at every evaluation;
        # its logged SE (std of 32 per-problem means / sqrt(32)) is at most 0.5 * sqrt(32/31) / sqrt(32)
        assert r["metric"] == "avg@8" and r["pass_k"] == 8 and r["heldout_n"] == 32
        assert len(r["greedy"]) == len(r["pass"]) == len(r["avg_se"]) == 3
        assert all(a <= p for a, p in zip(r["acc"], r["pass"])) and r["final_pass"] == r["pass"][-1]
        assert all(0 <= se <= 0.5 / math.sqrt(31) for se in r["avg_se"])
    # paired by seed: same seed -> same start (same model, same held-out set) for every arm
    for s in (0, 1):
        assert len({r["start_acc"] for r in runs if r["seed"] == s}) == 1
    paired = {d["arm"]: d for d in res["paired"]}
    assert set(paired) == {"coba", "coba+probe"}
    for arm, d in paired.items():
        diffs = [next(r for r in runs if r["arm"] == arm and r["seed"] == s)["final_acc"]
                 - next(r for r in runs if r["arm"] == "uniform" and r["seed"] == s)["final_acc"] for s in (0, 1)]
        assert d["final_acc"]["mean"] == pytest.approx(np.mean(diffs))
    assert [json.loads(l) for l in (table_dir / "runs.jsonl").read_text().splitlines()] == runs
    for name in ("accuracy_vs_rollouts", "difference_vs_uniform", "budget_vs_pass_rate", "alpha_beta_failure",
                 "zero_signal"):
        assert (table_dir / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    table = (table_dir / "table.md").read_text()
    assert "| coba+probe |" in table and "| final avg@8 |" in table and "final pass@8 (- uniform" in table
    assert "Standard error of one avg@8 evaluation over the n = 32 held-out problems" in table
    # resumable: a second call finds every run finished and trains nothing
    logs = {p: p.read_text() for p in (tmp_path / "runs").glob("*/log.jsonl")}
    again = compare.main(["--quick", "--arms", *arms, "--seeds", "0", "1", "--out", str(tmp_path)])
    assert again["runs"] == runs
    assert {p: p.read_text() for p in (tmp_path / "runs").glob("*/log.jsonl")} == logs
    # ...but not with other train.py flags: the finished runs' recorded flags (checkpoint's
    # run_config.json) are not this sweep's, so it refuses in one line rather than reuse them
    for flags, words in ((["--learning-rate", "0.01"], "--learning-rate 0.0002 -> 0.01"),
                         (["--steps", "8"], "--steps 6 -> 8")):
        with pytest.raises(SystemExit, match=f"6 runs in .* were made with other train.py flags .*{words}.*"
                                             "another --out, or --redo-mismatched"):
            compare.main(["--quick", "--arms", *arms, "--seeds", "0", "1", "--out", str(tmp_path), *flags])
    assert {p: p.read_text() for p in (tmp_path / "runs").glob("*/log.jsonl")} == logs


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    for argv, words in ((["--seeds", "0", "0"], "duplicates"), (["--jobs", "0"], "--jobs"),
                        (["--out", str(tmp_path / "f")], "is a file"),
                        (["--steps", "0"], "--steps must be >= 1"),  # not silently the preset's 100
                        (["--quick", "--eval-every", "0"], "--eval-every must be >= 1"),
                        (["--output-dir", "x"], "--output-dir would override .* use --out"),
                        (["--alloc", "knapsack"], "--allocator would override .* use --arms"),
                        (["--learning-rte", "0.01"], "unrecognized arguments: --learning-rte")):
        (tmp_path / "f").write_text("x")
        with pytest.raises(SystemExit) as exc:  # argparse's usage line + error, or one `error: ...` (harness/paths.py)
            compare.parse_args(argv)
        assert re.search(words, capsys.readouterr().err + str(exc.value.code)), words
    # explicit values win over --quick's (they used to be replaced by 6 and 3 without a word)
    args, _ = compare.parse_args(["--quick", "--steps", "9", "--eval-every", "2"])
    assert (args.steps, args.eval_every, args.seeds) == (9, 2, [0, 1])


def test_auc_and_rollouts_to_reach_by_hand():
    x, y = np.array([0.0, 100.0, 200.0]), np.array([0.2, 0.4, 0.3])
    # trapezoids: 100*(0.2+0.4)/2 + 100*(0.4+0.3)/2 = 30 + 35 = 65, over a span of 200 -> 0.325
    assert stats.auc(x, y) == pytest.approx(0.325, rel=1e-9)  # float64 trapezoids vs the hand value (0.2 + 0.4 != 0.6 in float64)
    assert stats.rollouts_to_reach(x, y, 0.35) == 100.0  # exact: an x of the grid, picked not computed
    assert stats.rollouts_to_reach(x, y, 0.5) is None


def test_paired_t_interval_and_min_detectable_by_hand():
    # d = [1, 2, 3]: mean 2, sd 1, n 3, t_.975,2 = 4.303 -> half width 4.303 / sqrt(3) = 2.4843
    res = stats.paired_t([1.0, 2.0, 3.0])
    assert res["mean"] == 2.0 and res["sd"] == 1.0  # exact: integer data: 6 / 3 and sqrt(2 / 2) have no rounding
    assert res["lo"] == pytest.approx(2 - 4.303 / math.sqrt(3)) and res["hi"] == pytest.approx(2 + 4.303 / math.sqrt(3))
    # 80% power at n = 5: (t_.975,4 + t_.80,4) * sd / sqrt(5) = (2.776 + 0.941) / sqrt(5)
    assert stats.min_detectable(1.0, 5) == pytest.approx((2.776 + 0.941) / math.sqrt(5))
    assert math.isnan(stats.paired_t([1.0])["lo"])


def test_t_table_matches_the_t_distribution():
    """The hard-coded quantiles against the t CDF integrated numerically (mpmath ships with sympy)."""
    mpmath = pytest.importorskip("mpmath")

    def cdf(t, df):  # P(T <= t) via the regularised incomplete beta function
        x = df / (df + t * t)
        return 1 - 0.5 * mpmath.betainc(df / 2, 0.5, 0, x, regularized=True)

    for df in (1, 2, 4, 9, 30):
        assert float(cdf(stats.T975[df - 1], df)) == pytest.approx(0.975, abs=2e-4)
        assert float(cdf(stats.T80[df - 1], df)) == pytest.approx(0.80, abs=2e-4)


def test_rollout_ratio_is_paired_and_censored_runs_say_never():
    def run(arm, seed, acc):
        return {"arm": arm, "seed": seed, "rollouts": [0.0, 100.0, 200.0], "acc": acc, "final_acc": acc[-1],
                "auc": stats.auc(np.array([0.0, 100.0, 200.0]), np.array(acc)), "zero_signal_group_share": 0,
                "zero_signal_rollout_share": 0, "train_seconds": 1, "prompts_at_min_budget": 0}

    runs = [run("uniform", 0, [0.1, 0.2, 0.3]), run("uniform", 1, [0.1, 0.2, 0.3]),
            run("fast", 0, [0.1, 0.3, 0.3]), run("fast", 1, [0.1, 0.3, 0.4]),
            run("slow", 0, [0.1, 0.2, 0.2]), run("slow", 1, [0.1, 0.2, 0.3])]
    summary, diffs = stats.compare_arms(runs)
    d = {x["arm"]: x for x in diffs}
    # target 0.3: uniform reaches it at 200 on both seeds, "fast" at 100 -> ratio 0.5 on both
    assert d["fast"]["rollout_ratio"]["geo_mean"] == pytest.approx(0.5)
    assert d["slow"]["rollout_ratio"]["geo_mean"] is None and d["slow"]["rollout_ratio"]["never"] == 1
    assert d["fast"]["final_acc"]["mean"] == pytest.approx(0.05)


def test_signal_prompts_is_the_effective_number_of_signal_groups_by_hand():
    """Two steps: 2 signal groups of 32 (the 2-rollout groups are all-0 / all-1) -> 2; then 3 equal
    signal groups of 8 -> 3; mean 2.5. Unequal groups count less than their number: 32 and 8 -> 1.47."""
    steps = [{"budgets": [32, 32, 2, 2], "group_reward": [0.5, 0.25, 0.0, 1.0]},
             {"budgets": [8, 8, 8, 8], "group_reward": [0.5, 0.125, 0.875, 0.0]}]
    assert stats.signal_prompts(steps) == pytest.approx(2.5)
    assert stats.signal_prompts([{"budgets": [32, 8], "group_reward": [0.5, 0.5]}]) == pytest.approx(40 ** 2 / (32 ** 2 + 8 ** 2))
    assert stats.signal_prompts([{"budgets": [4, 4], "group_reward": [0.0, 1.0]}]) == 0.0  # exact: no signal group: 0
    assert stats.signal_prompts([{"budgets": [4, 4]}]) is None  # a log from before group rewards


def test_rollout_ratio_when_uniform_starts_above_its_final_value_says_so():
    """A model that loses held-out accuracy (toy-strong) reaches uniform's final value at step 0:
    no speed-up can be measured, and the table must not print a ratio of 1."""
    def run(arm, seed, acc):
        return {"arm": arm, "seed": seed, "rollouts": [0.0, 100.0, 200.0], "acc": acc, "final_acc": acc[-1],
                "auc": stats.auc(np.array([0.0, 100.0, 200.0]), np.array(acc)), "zero_signal_group_share": 0,
                "zero_signal_rollout_share": 0, "train_seconds": 1, "prompts_at_min_budget": 0}

    runs = [run("uniform", 0, [0.6, 0.58, 0.56]), run("uniform", 1, [0.6, 0.57, 0.55]),
            run("coba", 0, [0.6, 0.55, 0.54]), run("coba", 1, [0.6, 0.56, 0.53])]
    summary, diffs = stats.compare_arms(runs)
    r = diffs[0]["rollout_ratio"]
    assert r["geo_mean"] is None and r["at_start"] == 2
    table = stats.markdown_table(summary, diffs, metric="avg@8")
    assert "n/a: uniform starts at or above its final value on 2 seeds" in table and "1.00" not in table
    assert "prompts carrying signal" not in table  # these runs have no signal_prompts: no column
    runs = [{**r, "signal_prompts": 16.0 if r["arm"] == "uniform" else 7.5} for r in runs]
    table = stats.markdown_table(*stats.compare_arms(runs), metric="avg@8")
    assert "prompts carrying signal per step (effective) |" in table
    assert table.splitlines()[2].endswith("| 16.0 |") and table.splitlines()[3].endswith("| 7.5 |")


# ----------------------------------------------------------------------------------------------
# Results files, reuse, failures and Ctrl-C (issue 25), with a fake train.py that takes no time
# ----------------------------------------------------------------------------------------------
FAKE_TRAIN = r'''
"""A stand-in for train.py: writes a log of the same shape at once (no torch). FAKE_FAIL_ARM makes
that allocator fail; FAKE_WAIT makes every run wait for SIGINT (as train.py: checkpoint, exit 0)."""
import json, os, signal, sys, time
from pathlib import Path


def config(flags):
    """The flags as the fake records them: {name: value} (a bare flag: True)."""
    out, key = {}, None
    for f in flags:
        if f.startswith("--"):
            key = f[2:].replace("-", "_")
            out[key] = True
        elif key is not None:
            out[key] = f
    return out


if __name__ == "__main__":
    c = config(sys.argv[1:])
    out = Path(c["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "calls.txt", "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\n")
    if c.get("allocator") == os.environ.get("FAKE_FAIL_ARM"):
        print("Traceback: boom, the fake trainer failed", file=sys.stderr)
        sys.exit(3)
    if os.environ.get("FAKE_WAIT"):
        got = []
        signal.signal(signal.SIGINT, lambda *a: got.append(a[0]))
        (out / "started").write_text("")
        for _ in range(2400):  # at most ~2 min, then give up (the test fails, no hang)
            if got:
                (out / "got-sigint").write_text("")
                sys.exit(0)
            time.sleep(0.05)
        sys.exit(4)
    steps, every, seed = int(c["steps"]), int(c["eval_every"]), int(c["seed"])
    shift = {"uniform": 0.0, "coba": 0.01, "knapsack": 0.02}.get(c["allocator"], 0.0)
    log = [{"type": "config", "step": -1, **c}]
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            acc, k = 0.1 + 0.01 * step + 0.001 * seed + shift, c.get("eval_samples", "0")
            log.append({"type": "eval", "step": step, "rollouts": 8 * step, "heldout_acc": acc,
                        **({f"heldout_avg@{k}": acc - 0.05, f"heldout_pass@{k}": acc + 0.2,
                            f"heldout_avg@{k}_se": 0.01} if k != "0" else {})})
        if step < steps:
            log.append({"type": "train", "step": step + 1, "budgets": [2, 6], "seen": int(step > 0),
                        "pass_rates": [0.5, 0.25], "zero_signal_groups": 1, "zero_signal_rollouts": 2,
                        "seconds": step + 1.0, "rollouts": 8 * (step + 1), "alpha_t": 5.0, "F_t": 0.6})
    log.append({"type": "summary", "step": steps})
    (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
'''


def plain_read_log(run_dir):
    return compare.read_jsonl(run_dir / "log.jsonl")


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    """compare.py with the fake trainer: runs take milliseconds, flags are recorded as given."""
    path = tmp_path / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    config = runpy.run_path(str(path))["config"]
    monkeypatch.setattr(compare, "TRAIN", [sys.executable, str(path)])
    monkeypatch.setattr(compare, "expected_config", config)
    monkeypatch.setattr(compare, "read_log", plain_read_log)
    monkeypatch.setattr(compare, "prepare_model", lambda args: None)
    monkeypatch.setattr(compare, "mismatched_runs", _mismatched_runs_plain)
    return path


def _mismatched_runs_plain(jobs, out, extra):  # compare.mismatched_runs without train.py's checkpoints
    found = {}
    for arm, seed in jobs:
        log = plain_read_log(compare.run_dir_for(out, arm, seed))
        if any(r["type"] == "summary" for r in log):
            diffs = compare.config_diffs(log[0], compare.expected_config(compare.train_argv(arm, seed, extra)), {})
            if diffs:
                found[(arm, seed)] = diffs
    return found


def test_plots_only_redraws_from_runs_jsonl_and_never_empties_results(tmp_path):
    """Issue 25.2: on a fresh checkout results/runs/ is absent; --plots-only used to truncate the
    committed runs.jsonl (30 lines -> 0), compare.jsonl and table.md, and exit 0."""
    table_dir = tmp_path / "headline"
    table_dir.mkdir()
    # the greedy-only headline sweep of an earlier session (results/headline at a7c6c27), kept as a fixture
    for name in ("runs.jsonl", "compare.jsonl", "table.md"):
        shutil.copy(Path(__file__).parent / "fixtures" / "greedy-headline" / name, table_dir / name)
    runs_before = (table_dir / "runs.jsonl").read_text()
    config_before = compare.read_jsonl(table_dir / "compare.jsonl")[0]
    res = compare.main(["--plots-only", "--out", str(tmp_path)])
    assert (table_dir / "runs.jsonl").read_text() == runs_before  # all 30 runs, untouched
    assert len(res["runs"]) == 30 and len(res["summary"]) == 6
    rows = compare.read_jsonl(table_dir / "compare.jsonl")
    assert rows[0]["wall_seconds"] == config_before["wall_seconds"]  # the sweep's config, not the redraw's
    # the sweep's config line as it was (issue 32: no redraw argv), with the metric it is tabled on
    assert rows[0] == {**config_before, "metric": "greedy", "metric_note": rows[0]["metric_note"]}
    table = (table_dir / "table.md").read_text()
    assert "| coba+probe |" in table and "| final greedy acc |" in table  # greedy-only runs: greedy, said so
    assert "primary metric (held-out avg@k, --eval-samples) is missing from these runs" in table
    assert "sqrt(p(1-p)/n) = " in table  # n = 1024 from the sweep's --eval-size
    assert (table_dir / "zero_signal.png").read_bytes()[:4] == b"\x89PNG"
    # a redraw of fewer runs than the table reports is refused, and changes nothing
    table = (table_dir / "table.md").read_text()
    with pytest.raises(SystemExit, match="would drop .*pass the same --arms and --seeds, or another --out"):
        compare.main(["--plots-only", "--seeds", "0", "1", "--out", str(tmp_path)])
    assert (table_dir / "table.md").read_text() == table and (table_dir / "runs.jsonl").read_text() == runs_before
    # an interim table of 3 seeds grown to the preset's 5 by a redraw records the redraw's seeds and
    # command: the old line said seeds 0-2 beside a table of five
    (table_dir / "compare.jsonl").unlink()
    compare.main(["--plots-only", "--seeds", "0", "1", "2", "--out", str(tmp_path)])
    assert compare.read_jsonl(table_dir / "compare.jsonl")[0]["seeds"] == [0, 1, 2]
    compare.main(["--plots-only", "--out", str(tmp_path)])
    grown = compare.read_jsonl(table_dir / "compare.jsonl")
    assert grown[0]["seeds"] == [0, 1, 2, 3, 4] and grown[0]["argv"] == ["--plots-only", "--out", str(tmp_path)]
    assert all(r["seeds"] == [0, 1, 2, 3, 4] for r in grown[1:])
    # nothing to redraw: an error, and no file is written
    with pytest.raises(SystemExit, match="nothing to redraw"):
        compare.main(["--plots-only", "--out", str(tmp_path / "empty")])
    assert not (tmp_path / "empty").exists()


def test_reused_runs_must_have_this_sweeps_flags(tmp_path, fake_train):
    """Issue 25.7: a --quick sweep then a longer one into the same --out used to build the second
    table from the 6-step runs; extra flags were recorded but not used by reused runs."""
    argv = ["--quick", "--arms", "uniform", "coba", "--seeds", "0", "--out", str(tmp_path)]
    first = compare.main(argv)
    assert [len(r["acc"]) for r in first["runs"]] == [3, 3]  # evals at steps 0, 3, 6
    calls = {p: p.read_text() for p in (tmp_path / "runs").glob("*/calls.txt")}
    with pytest.raises(SystemExit, match=r"2 runs in .* other train.py flags .*--steps 6 -> 12.*another --out, "
                                         "or --redo-mismatched"):
        compare.main([*argv, "--steps", "12"])
    with pytest.raises(SystemExit, match="--learning-rate None -> 0.01"):
        compare.main([*argv, "--learning-rate", "0.01"])
    assert {p: p.read_text() for p in (tmp_path / "runs").glob("*/calls.txt")} == calls  # nothing ran
    again = compare.main([*argv, "--steps", "12", "--redo-mismatched"])  # trained again, from scratch
    assert [len(r["acc"]) for r in again["runs"]] == [5, 5]
    for p in (tmp_path / "runs").glob("*/calls.txt"):
        assert p.read_text().splitlines()[-1].endswith("--overwrite")
    stored = compare.read_jsonl(tmp_path / "quick" / "runs.jsonl")
    assert [len(r["acc"]) for r in stored] == [5, 5]  # the summaries were replaced, not appended


def test_a_failed_run_stops_the_queue_at_once_with_its_output(tmp_path, fake_train, monkeypatch, capsys):
    """Issue 25.11: a failure used to surface only after the whole queue had run."""
    monkeypatch.setenv("FAKE_FAIL_ARM", "coba")
    with pytest.raises(SystemExit) as e:
        compare.main(["--quick", "--arms", "uniform", "coba", "knapsack", "--seeds", "0", "--jobs", "1",
                      "--out", str(tmp_path)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "run coba seed 0 failed (exit 3)" in err and "boom, the fake trainer failed" in err
    assert "0 stopped at their last checkpoint, 1 not started" in err and "run the same command again" in err
    assert not compare.run_dir_for(tmp_path, "knapsack", 0).exists()  # never started
    # the run that finished before the failure is kept in runs.jsonl
    assert [(r["arm"], r["seed"]) for r in compare.read_jsonl(tmp_path / "quick" / "runs.jsonl")] == [("uniform", 0)]


DRIVER = """
import sys, runpy
sys.path.insert(0, {repo!r})
import compare
fake = {fake!r}
compare.TRAIN = [sys.executable, fake]
compare.expected_config = runpy.run_path(fake)["config"]
compare.read_log = lambda d: compare.read_jsonl(d / "log.jsonl")
compare.prepare_model = lambda args: None
compare.main({argv!r})
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_queue_and_passes_it_on_to_the_runs(tmp_path, fake_train, sig):
    """Issue 25.11: Ctrl-C used to leave compare.py starting the queued runs (~1 hour)."""
    argv = ["--quick", "--arms", "uniform", "coba", "--seeds", "0", "1", "--jobs", "2", "--out", str(tmp_path)]
    code = DRIVER.format(repo=str(compare.REPO), fake=str(fake_train), argv=argv)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "FAKE_WAIT": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = lambda: sorted(p.parent.name for p in (tmp_path / "runs").glob("*/started"))
    for _ in range(2400):  # wait (bounded) until both parallel runs are going
        if len(started()) == 2 or proc.poll() is not None:
            break
        subprocess.run(["sleep", "0.05"])
    assert started() == ["coba-seed0", "uniform-seed0"], proc.communicate()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    # each running train.py got one SIGINT (it checkpoints and exits); the queued two never started
    assert sorted(p.parent.name for p in (tmp_path / "runs").glob("*/got-sigint")) == started()
    assert not (tmp_path / "runs" / "uniform-seed1").exists() and not (tmp_path / "runs" / "coba-seed1").exists()
    assert "2 stopped at their last checkpoint, 2 not started; run the same command again to resume" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_kill_9_of_compare_stops_its_runs_instead_of_orphaning_them(tmp_path, fake_train):
    """kill -9 of compare.py used to leave its train.py children training on, unseen, holding their
    run directories' locks: now each gets one SIGINT from the kernel (checkpoint, exit), and the
    next compare.py resumes them."""
    argv = ["--quick", "--arms", "uniform", "coba", "--seeds", "0", "--jobs", "2", "--out", str(tmp_path)]
    code = DRIVER.format(repo=str(compare.REPO), fake=str(fake_train), argv=argv)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "FAKE_WAIT": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marks = lambda name: sorted(p.parent.name for p in (tmp_path / "runs").glob(f"*/{name}"))
    for _ in range(2400):  # wait (bounded) until both runs are going
        if len(marks("started")) == 2 or proc.poll() is not None:
            break
        subprocess.run(["sleep", "0.05"])
    assert marks("started") == ["coba-seed0", "uniform-seed0"], proc.communicate()
    proc.kill()  # SIGKILL: compare.py cannot pass anything on
    proc.communicate(timeout=60)
    for _ in range(1200):  # the fake exits on its first SIGINT; without one it waits ~2 min
        if len(marks("got-sigint")) == 2:
            break
        subprocess.run(["sleep", "0.05"])
    assert marks("got-sigint") == ["coba-seed0", "uniform-seed0"]


def test_primary_metric_secondaries_and_evaluation_noise_by_hand():
    """Issue 19: avg@8 primary, greedy and pass@8 secondary; greedy-only runs (the committed results)
    and a mix fall back to greedy with a note; the footer's standard errors by hand."""
    def run(arm, seed, avg, greedy, passk, se=0.01):
        x = [0.0, 100.0]
        return {"arm": arm, "seed": seed, "metric": "avg@8", "heldout_n": 100, "rollouts": x, "acc": avg,
                "final_acc": avg[-1], "start_acc": avg[0], "auc": stats.auc(np.array(x), np.array(avg)),
                "greedy": greedy, "final_greedy": greedy[-1], "pass_k": 8, "pass": passk, "final_pass": passk[-1],
                "avg_se": [se, se], "zero_signal_group_share": 0, "zero_signal_rollout_share": 0,
                "train_seconds": 1, "prompts_at_min_budget": 0}

    runs = [run("uniform", 0, [0.2, 0.3], [0.3, 0.4], [0.5, 0.6]), run("uniform", 1, [0.2, 0.3], [0.3, 0.4], [0.5, 0.6]),
            run("coba", 0, [0.2, 0.4], [0.3, 0.3], [0.5, 0.7]), run("coba", 1, [0.2, 0.2], [0.3, 0.5], [0.5, 0.7], 0.02)]
    view, metric, note = compare.table_view(runs)
    assert (metric, note) == ("avg@8", None) and view == runs
    summary, diffs = stats.compare_arms(view)
    d = diffs[0]
    assert d["final_acc"]["mean"] == pytest.approx(0.0)  # avg@8: +0.1 and -0.1
    assert d["final_greedy"]["mean"] == pytest.approx(0.0) and d["final_pass"]["mean"] == pytest.approx(0.1)
    footer = stats.evaluation_noise(view, metric, 100)
    assert "0.0100 to 0.0200, median 0.0100" in footer[0]
    # greedy at p = mean final greedy 0.4: sqrt(0.4 * 0.6 / 100) = 0.0490
    assert "sqrt(p(1-p)/n) = 0.0490 at p = 0.400" in footer[1]
    table = stats.markdown_table(summary, diffs, metric, 8, footer)
    assert "| coba | 0.300 ± 0.100 |" in table and "| 0.400 (" in table and "| 0.700 (+0.100 [+0.100, +0.100]) |" in table
    # without the logged SE: the bounds at p = 0.3 (mean final avg@8), n = 100, k = 8
    bounds = stats.evaluation_noise([{**r, "avg_se": None} for r in view], metric, 100)[0]
    assert f"{math.sqrt(0.21 / 800):.4f}" in bounds and f"{math.sqrt(0.21 / 100):.4f}" in bounds
    # a greedy-only run among them (runs.jsonl before issue 19): every run falls back to greedy
    old = {k: v for k, v in runs[0].items() if k not in ("metric", "greedy", "final_greedy", "pass", "final_pass",
                                                         "pass_k", "avg_se")}
    old.update(acc=[0.3, 0.4], final_acc=0.4, start_acc=0.3)
    view, metric, note = compare.table_view([old] + runs[1:])
    assert metric == "greedy" and "missing from some of these runs" in note
    assert [r["final_acc"] for r in view] == [0.4, 0.4, 0.3, 0.5]  # exact: copied from the runs
    assert all(r["final_greedy"] is None and r["final_pass"] is None for r in view)


def test_toy_reason_has_its_own_regime_and_the_others_keep_theirs():
    """compare.MODEL_REGIMES (issue 30): --model toy-reason gets its lr, pool, steps and evaluation
    points; --steps/--eval-every still win; toy and toy-strong keep REGIME and the preset's 100/25."""
    args, _ = compare.parse_args(["--model", "toy-reason"])
    assert (args.steps, args.eval_every) == (40, 20)
    assert compare.MODEL_REGIMES["toy-reason"]["flags"][:2] == ["--learning-rate", "3e-4"]
    args, _ = compare.parse_args(["--model", "toy-reason", "--steps", "7", "--eval-every", "7"])
    assert (args.steps, args.eval_every) == (7, 7)
    for model in ("toy", "toy-strong"):
        args, _ = compare.parse_args(["--model", model])
        assert (args.steps, args.eval_every) == (100, 25) and model not in compare.MODEL_REGIMES


def test_interpolated_reach_and_gain_target_by_hand():
    x, y = np.array([0.0, 100.0, 200.0, 300.0]), np.array([0.2, 0.4, 0.3, 0.5])
    assert stats.rollouts_to_reach_interpolated(x, y, 0.3) == pytest.approx(50.0)  # halfway up the first rise
    assert stats.rollouts_to_reach_interpolated(x, y, 0.2) == 0.0 and stats.rollouts_to_reach_interpolated(x, y, 0.6) is None  # exact: x[0], picked not interpolated
    # plateau: the last PLATEAU_EVALS = 4 evaluations but never the start: (0.4 + 0.3 + 0.5) / 3 = 0.4
    assert stats.plateau(y) == pytest.approx(0.4)
    assert stats.gain_target({"acc": list(y)}, 0.5) == pytest.approx(0.2 + 0.5 * 0.2)
    assert stats.gain_target({"acc": [0.5, 0.4, 0.45]}) is None  # no gain to reach a share of


def _made_up_runs(draw: int, time_constant: float, speed: float) -> list[dict]:
    """8 paired seeds of uniform and an arm whose true curve is uniform's run `speed` times faster:
    acc(x) = 0.26 + 0.22 (1 - exp(-speed x / time_constant)) at 7 evaluations 5,120 rollouts apart,
    each with Gaussian noise of sd 0.012 (one avg@8 evaluation's standard error on toy-reason); the
    two arms of a seed share their start (the same initial model)."""
    x = np.arange(7) * 5120.0
    rng = np.random.default_rng(draw)
    runs = []
    for seed in range(8):
        start = 0.26 + rng.normal(0, 0.008)
        for arm, sp in (("uniform", 1.0), ("arm", speed)):
            y = 0.26 + 0.22 * (1 - np.exp(-sp * x / time_constant)) + rng.normal(0, 0.012, len(x))
            y[0] = start
            runs.append({"arm": arm, "seed": seed, "rollouts": list(x), "acc": list(y), "final_acc": y[-1],
                         "auc": stats.auc(x, y), "avg_se": [0.012] * len(x), "zero_signal_group_share": 0,
                         "zero_signal_rollout_share": 0, "train_seconds": 1, "prompts_at_min_budget": 0})
    return runs


def test_gain_share_ratio_is_not_a_speed_up_on_a_noisy_plateau_and_finds_a_real_one():
    """The table's second rollouts measure (80% of each seed's uniform gain, interpolated) on made-up
    curves, 40 draws each. An arm whose true curve IS uniform's must not come out faster beyond the
    measure's own noise, whether the curves are flat from the first evaluation on (as toy-reason's
    are) or rise over several: its 95% CI holds 1 in >= 36 of 40 draws and its geometric mean stays
    in [0.85, 1.2]; moving the target by a fifth of one evaluation's standard error moves it by
    < 0.05 on the flat curves (where "uniform's final value" can move by an evaluation interval).
    An arm twice as fast, on curves the evaluation grid resolves, comes out faster in every draw
    (CI below 1, geometric mean <= 0.65)."""
    share = f"{stats.GAIN_SHARE:.0%}"
    for time_constant in (2500.0, 10000.0):
        diffs = [stats.compare_arms(_made_up_runs(d, time_constant, 1.0))[1][0] for d in range(40)]
        ratios = [d["gain_ratio"] for d in diffs]
        assert sum(r["lo"] <= 1 <= r["hi"] for r in ratios) >= 36, time_constant
        assert all(0.85 <= r["geo_mean"] <= 1.2 for r in ratios), [r["geo_mean"] for r in ratios]
        if time_constant == 2500.0:  # exact: the loop's own value
            for d in diffs:
                at = d["gain_ratio"]["geo_mean"]
                for sign in "-+":
                    assert abs(d["reach_sensitivity"][f"{share} of the gain, target {sign} SE/5"]["geo_mean"] - at) < 0.05
    faster = [stats.compare_arms(_made_up_runs(d, 10000.0, 2.0))[1][0]["gain_ratio"] for d in range(40)]
    assert all(r["hi"] < 1 and r["geo_mean"] <= 0.65 for r in faster), [(r["geo_mean"], r["hi"]) for r in faster]


# The rollouts measure's power (issue 56): what stats.measure_power reads for a known speed-up. Every
# case is seeded (seed 0, 100 draws); the tolerances were set from seeds 0-3, where the numbers moved
# by < 0.02 in median read and < 0.06 in the shares.
FINE_GRID = np.arange(13) * 2560.0  # 13 evaluations 2,560 rollouts apart
TOY_REASON_GRID = np.arange(7) * 5120.0  # the paper regime's: every 20 steps of 256 rollouts


def test_measure_power_reads_a_speed_up_where_the_grid_resolves_the_rise():
    """Slow rise (tau 10,000 rollouts, 23% of the rise by the first evaluation), fine grid, 5 seeds,
    noise 0.012: a true 2x reads 0.5 +- 0.05 and is found faster (CI upper < 1) and "helps" by the
    rule (<= 0.7x) in >= 95% of draws; a true 1x reads 1 +- 0.05, its CI holds 1 in >= 90% of draws,
    and it is called faster in <= 5%."""
    rows = {r["speedup"]: r for r in stats.measure_power(0.26, 0.48, 10000.0, 0.012, FINE_GRID, seeds=5, draws=100)}
    assert abs(rows[2.0]["median_read"] - 0.5) < 0.05 and rows[2.0]["share_faster"] >= 0.95, rows[2.0]
    assert rows[2.0]["share_helps"] >= 0.95, rows[2.0]
    assert abs(rows[1.0]["median_read"] - 1) < 0.05 and rows[1.0]["share_ci_holds_1"] >= 0.9, rows[1.0]
    assert rows[1.0]["share_faster"] <= 0.05 and rows[1.5]["share_faster"] >= 0.9, rows


def test_measure_power_is_blind_on_curves_as_flat_as_toy_reasons():
    """toy-reason's paper regime (tau 2,400 rollouts: 88% of the rise by the first evaluation at
    5,120; noise 0.013; 8 seeds): a true 2x reads >= 0.8 (the known blindness: the measure compares the
    first evaluations' gains), a true 1.5x >= 0.85, and neither passes the rule's 0.7x bar in more than
    5% of draws; a true 1x reads 1 +- 0.05 with its CI holding 1 in >= 90% of draws."""
    rows = {r["speedup"]: r for r in stats.measure_power(0.26, 0.48, 2400.0, 0.013, TOY_REASON_GRID, seeds=8, draws=100)}
    assert rows[2.0]["median_read"] >= 0.8 and rows[1.5]["median_read"] >= 0.85, rows
    assert rows[2.0]["share_helps"] <= 0.05 and rows[1.5]["share_helps"] <= 0.05, rows
    assert abs(rows[1.0]["median_read"] - 1) < 0.05 and rows[1.0]["share_ci_holds_1"] >= 0.9, rows[1.0]


def test_measure_power_without_noise_is_the_ratio_of_interpolated_crossings_by_hand():
    """No noise: every draw reads the same ratio. Both crossings of 80% of uniform's gain lie on the
    first segment [0, 5120], read straight: x = 5120 * target_gain / gain at 5120, so arm / uniform =
    f(5120) / f(2 * 5120) with f(r) = 1 - exp(-r / 2400), whatever the target (0.894, not 0.5)."""
    (row,) = stats.measure_power(0.26, 0.48, 2400.0, 0.0, TOY_REASON_GRID, speedups=(2.0,), seeds=3, draws=5)
    f = lambda r: 1 - math.exp(-r / 2400.0)
    assert row["median_read"] == pytest.approx(f(5120) / f(10240), rel=1e-9)
    assert row["share_faster"] == 1.0 and row["share_helps"] == 0.0  # exact: shares of 5 draws that all read the same


def test_fit_rise_recovers_a_made_up_curve_and_calibrate_skips_a_curve_that_does_not_rise():
    """fit_rise on 5 made-up uniform seeds (tau 5,000, noise 0.005) gets tau within 10% and start and
    plateau within 0.01; an arm other than uniform is left out of the fit. calibrate on curves that
    fall (plateau below start, as toy-strong's uniform does) computes no power and says why."""
    rng = np.random.default_rng(0)

    def runs(start, end, tau):
        return [{"arm": arm, "seed": s, "rollouts": list(FINE_GRID), "avg_se": [0.005] * len(FINE_GRID),
                 "acc": list(stats.rise_curve(FINE_GRID, start, end if arm == "uniform" else 0.9, tau)
                             + rng.normal(0, 0.005, len(FINE_GRID)))}
                for s in range(5) for arm in ("uniform", "other")]

    fit = stats.fit_rise(runs(0.26, 0.48, 5000.0))
    assert abs(fit["tau"] / 5000.0 - 1) < 0.1 and abs(fit["start"] - 0.26) < 0.01 and abs(fit["plateau"] - 0.48) < 0.01
    assert fit["seeds"] == 5 and fit["grid"] == list(FINE_GRID) and fit["noise_se"] == pytest.approx(0.005)  # exact: the grid is copied
    cal = stats.calibrate(runs(0.59, 0.56, 500.0), draws=5)
    assert cal["rows"] is None and "does not rise" in cal["text"]
