"""The experiment script (issue 12) in its --quick form, and its statistics by hand.
Run: python -m pytest -q tests/test_compare.py"""
import json
import math

import numpy as np
import pytest

import compare


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
    assert "| coba+probe |" in (table_dir / "table.md").read_text()
    # resumable: a second call finds every run finished and trains nothing
    logs = {p: p.read_text() for p in (tmp_path / "runs").glob("*/log.jsonl")}
    again = compare.main(["--quick", "--arms", *arms, "--seeds", "0", "1", "--out", str(tmp_path)])
    assert again["runs"] == runs
    assert {p: p.read_text() for p in (tmp_path / "runs").glob("*/log.jsonl")} == logs


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    for argv, words in ((["--seeds", "0", "0"], "duplicates"), (["--jobs", "0"], "--jobs"),
                        (["--out", str(tmp_path / "f")], "is a file")):
        (tmp_path / "f").write_text("x")
        with pytest.raises(SystemExit):
            compare.parse_args(argv)
        assert words in capsys.readouterr().err


def test_auc_and_rollouts_to_reach_by_hand():
    x, y = np.array([0.0, 100.0, 200.0]), np.array([0.2, 0.4, 0.3])
    # trapezoids: 100*(0.2+0.4)/2 + 100*(0.4+0.3)/2 = 30 + 35 = 65, over a span of 200 -> 0.325
    assert compare.auc(x, y) == 0.325
    assert compare.rollouts_to_reach(x, y, 0.35) == 100.0
    assert compare.rollouts_to_reach(x, y, 0.5) is None


def test_paired_t_interval_and_min_detectable_by_hand():
    # d = [1, 2, 3]: mean 2, sd 1, n 3, t_.975,2 = 4.303 -> half width 4.303 / sqrt(3) = 2.4843
    res = compare.paired_t([1.0, 2.0, 3.0])
    assert res["mean"] == 2.0 and res["sd"] == 1.0
    assert res["lo"] == pytest.approx(2 - 4.303 / math.sqrt(3)) and res["hi"] == pytest.approx(2 + 4.303 / math.sqrt(3))
    # 80% power at n = 5: (t_.975,4 + t_.80,4) * sd / sqrt(5) = (2.776 + 0.941) / sqrt(5)
    assert compare.min_detectable(1.0, 5) == pytest.approx((2.776 + 0.941) / math.sqrt(5))
    assert math.isnan(compare.paired_t([1.0])["lo"])


def test_t_table_matches_the_t_distribution():
    """The hard-coded quantiles against the t CDF integrated numerically (mpmath ships with sympy)."""
    mpmath = pytest.importorskip("mpmath")

    def cdf(t, df):  # P(T <= t) via the regularised incomplete beta function
        x = df / (df + t * t)
        return 1 - 0.5 * mpmath.betainc(df / 2, 0.5, 0, x, regularized=True)

    for df in (1, 2, 4, 9, 30):
        assert float(cdf(compare.T975[df - 1], df)) == pytest.approx(0.975, abs=2e-4)
        assert float(cdf(compare.T80[df - 1], df)) == pytest.approx(0.80, abs=2e-4)


def test_rollout_ratio_is_paired_and_censored_runs_say_never():
    def run(arm, seed, acc):
        return {"arm": arm, "seed": seed, "rollouts": [0.0, 100.0, 200.0], "acc": acc, "final_acc": acc[-1],
                "auc": compare.auc(np.array([0.0, 100.0, 200.0]), np.array(acc)), "zero_signal_group_share": 0,
                "zero_signal_rollout_share": 0, "train_seconds": 1, "prompts_at_min_budget": 0}

    runs = [run("uniform", 0, [0.1, 0.2, 0.3]), run("uniform", 1, [0.1, 0.2, 0.3]),
            run("fast", 0, [0.1, 0.3, 0.3]), run("fast", 1, [0.1, 0.3, 0.4]),
            run("slow", 0, [0.1, 0.2, 0.2]), run("slow", 1, [0.1, 0.2, 0.3])]
    summary, diffs = compare.compare_arms(runs)
    d = {x["arm"]: x for x in diffs}
    # target 0.3: uniform reaches it at 200 on both seeds, "fast" at 100 -> ratio 0.5 on both
    assert d["fast"]["rollout_ratio"]["geo_mean"] == pytest.approx(0.5)
    assert d["slow"]["rollout_ratio"]["geo_mean"] is None and d["slow"]["rollout_ratio"]["never"] == 1
    assert d["fast"]["final_acc"]["mean"] == pytest.approx(0.05)
