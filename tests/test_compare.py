"""The experiment script (issue 6) in its --quick form: files written and well-formed.
Run: python -m pytest -q tests/test_compare.py"""
import json

import compare


def test_quick_compare_writes_results_and_plots(tmp_path, toy_model_dir):
    rows = compare.main(["--quick", "--seeds", "0", "1", "--out", str(tmp_path)])
    lines = [json.loads(l) for l in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "config" and lines[1:] == rows
    runs = [r for r in rows if r["type"] == "run"]
    summary = {r["allocator"]: r for r in rows if r["type"] == "summary"}
    assert len(runs) == 4 * 2 and set(summary) == set(compare.ALLOCATORS)
    for r in runs:
        # equal budget: every allocator consumed exactly steps * M * G = 6 * 8 * 4 rollouts
        assert r["total_rollouts"] == 6 * 32 and r["rollouts"][-1] == 6 * 32
        assert len(r["acc"]) == len(r["rollouts"]) == 3 and all(0 <= a <= 1 for a in r["acc"])
        assert 0 <= r["zero_signal_group_share"] <= 1
    u = summary["uniform"]
    assert u["final_acc_mean"] == sum(r["final_acc"] for r in runs if r["allocator"] == "uniform") / 2
    for name in ("accuracy_vs_rollouts", "budget_vs_pass_rate", "alpha_beta_failure", "zero_signal"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "| coba |" in compare.markdown_table(list(summary.values()))


def test_auc_and_rollouts_to_reach_by_hand():
    import numpy as np

    x, y = np.array([0.0, 100.0, 200.0]), np.array([0.2, 0.4, 0.3])
    # trapezoids: 100*(0.2+0.4)/2 + 100*(0.4+0.3)/2 = 30 + 35 = 65, over a span of 200 -> 0.325
    assert compare.auc(x, y) == 0.325
    assert compare.rollouts_to_reach(x, y, 0.35) == 100.0
    assert compare.rollouts_to_reach(x, y, 0.5) is None
