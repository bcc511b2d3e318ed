"""Issue 42's instruments: per-level held-out accuracy, the coba-oracle diagnostic, and the presets.

- Every evaluation logs greedy accuracy, avg@k and pass@k per difficulty level of the lab
  (`heldout_by_level`), checked exactly on a scripted policy whose outcomes are a known function of
  (level, row); compare.py tables the hardest level's avg@k beside the whole set's, with a paired CI.
- `--pass-rate-source oracle` (arm `coba-oracle`, ours, a diagnostic): before allocating, K fresh
  rollouts per prompt estimate its current pass rate. They are never trained on (the update sees
  exactly the training round's B_i rows) and never counted (the log's rollouts grow by B_total a
  step; the oracle's are logged apart), and the allocator gets their successes / K.
- compare.py's breadth-depth and paper-regime presets resolve to the train.py flags they promise.

Run: python -m pytest -q tests/test_regime.py   (about half a minute on one core)
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from engines import checkpoint
import compare
from harness import evaluate
from harness import stats
import train
from harness import run as run_setup
from test_step import BASE, FixedRollouts, is_correct

K_EVAL = 4  # avg@4 in the scripted evaluation


class ScriptedPolicy:
    """Stands in for rollout.generate_groups on the held-out set: a problem of level L is answered
    right greedily iff L is even, and sample r of it is right iff r < L % (K_EVAL + 1); so per level
    acc = [L even], avg@k = min(L % 5, k) / k and pass@k = [L % 5 > 0], known before the run."""

    def __init__(self, tokenizer, records: list[dict]):
        self.tok = tokenizer
        self.by_question = {r["question"]: r for r in records}

    def __call__(self, model, tokenizer, prompt_ids, budgets, *, max_new_tokens, logprobs_out=None, **kw):
        out = []
        for p, B in zip(prompt_ids, budgets):
            rec = self.by_question[self.tok.decode(p, skip_special_tokens=True)]
            L = rec["level"]
            for r in range(B):
                right = L % 2 == 0 if kw.get("greedy") else r < L % (K_EVAL + 1)
                text = rec["answer"] if right else str(int(rec["answer"]) + 1)
                out.append(self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id])
        if logprobs_out is not None:
            logprobs_out.extend(None for _ in out)
        return out


def test_every_evaluation_logs_accuracy_per_level(tmp_path, toy_model_dir, monkeypatch):
    from toy import build_tokenizer

    real_load_data = evaluate.load_data
    seen = {}

    def load_data(args, *a, **kw):
        train_set, evals = real_load_data(args, *a, **kw)
        seen["heldout"] = evals["heldout"]
        monkeypatch.setattr(evaluate, "generate_groups", ScriptedPolicy(build_tokenizer(), evals["heldout"]))
        return train_set, evals

    monkeypatch.setattr(evaluate, "load_data", load_data)
    flags = ["--model", "toy", "--dataset", "toy", "--eval-size", "40", "--eval-samples", str(K_EVAL),
             "--eval-only", "--no-progress", "--device", "cpu", "--output-dir", str(tmp_path)]
    record = train.main(flags)
    levels = [r["level"] for r in seen["heldout"]]
    assert len(set(levels)) == 8  # the toy lab's 8 levels, round-robin
    by_level = record["heldout_by_level"]
    assert sorted(by_level, key=int) == [str(L) for L in sorted(set(levels))]
    for L in sorted(set(levels)):
        got = by_level[str(L)]
        assert got["n"] == levels.count(L)
        assert got["acc"] == float(L % 2 == 0)  # exact: a level's problems alike: the mean of equal 0/1 values
        assert got[f"avg@{K_EVAL}"] == pytest.approx(min(L % 5, K_EVAL) / K_EVAL)
        assert got[f"pass@{K_EVAL}"] == float(L % 5 > 0)  # exact: a level's problems alike: the mean of equal 0/1 values
        assert got[f"avg@{K_EVAL}_se"] == 0.0  # exact: equal values: every deviation is 0; every problem of a level alike
    # the whole set is the levels' problem-weighted mean, and the log holds what main returned
    n = sum(v["n"] for v in by_level.values())
    assert record[f"heldout_avg@{K_EVAL}"] == pytest.approx(
        sum(v[f"avg@{K_EVAL}"] * v["n"] for v in by_level.values()) / n)
    logged = [r for r in checkpoint.read_log(tmp_path / "log.jsonl") if r["type"] == "eval"]
    assert logged[0]["heldout_by_level"] == json.loads(json.dumps(by_level))


def _log(finals_by_level: dict[str, float], start: float = 0.2) -> list[dict]:
    """A minimal run log: config, two evaluations with per-level avg@2, one train step."""
    def ev(step, whole, levels):
        return {"type": "eval", "step": step, "rollouts": step * 8, "heldout_acc": whole, "heldout_avg@2": whole,
                "heldout_pass@2": whole, "heldout_avg@2_se": 0.01,
                "heldout_by_level": {L: {"acc": v, "avg@2": v, "pass@2": v, "n": 10} for L, v in levels.items()}}
    train_rec = {"type": "train", "step": 1, "rollouts": 8, "seconds": 1.0, "budgets": [4, 4], "seen": 0,
                 "zero_signal_groups": 0, "zero_signal_rollouts": 0, "group_reward": [0.5, 0.5],
                 "alpha_t": 5.0, "F_t": 0.5}
    whole = float(np.mean(list(finals_by_level.values())))
    return [{"type": "config", "eval_samples": 2, "eval_size": 20},
            ev(0, start, {L: start for L in finals_by_level}), train_rec, ev(1, whole, finals_by_level)]


def test_tables_carry_the_hardest_level_with_a_paired_ci():
    runs = [compare.summarise_run(arm, seed, _log({"0": 0.9, "4": hard}))
            for seed, (u, c) in enumerate([(0.30, 0.40), (0.32, 0.41), (0.28, 0.43)])
            for arm, hard in (("uniform", u), ("coba", c))]
    assert {r["hard_level"] for r in runs} == {4} and runs[1]["final_hard"] == 0.40  # exact: copied from the log
    summary, diffs = stats.compare_arms(runs)
    d = next(d for d in diffs if d["arm"] == "coba")["final_hard"]
    assert d["mean"] == pytest.approx(np.mean([0.10, 0.09, 0.15])) and d["lo"] > 0
    table = stats.markdown_table(summary, diffs, "avg@2", 2, hard_label=" (level 4, n = 10)")
    assert "final avg@2, hardest level (level 4, n = 10)" in table.splitlines()[0]
    coba_row = next(line for line in table.splitlines() if line.startswith("| coba "))
    assert "0.413 (+0.113 [" in coba_row
    # a log from before issue 42 (no per-level records) gives no such column: old tables redraw as they were
    old = [{k: v for k, v in r.items() if k != "heldout_by_level"} for r in _log({"0": 0.9, "4": 0.3})]
    assert "final_hard" not in compare.summarise_run("uniform", 0, old)


# ----------------------------------------------------------------------------------------------
# The oracle diagnostic
# ----------------------------------------------------------------------------------------------
ORACLE_K = 6  # differs from every B_i the fixture allocates on step 1, so the rows cannot be confused


def test_coba_oracle_rollouts_are_neither_trained_on_nor_counted(tmp_path, toy_model_dir, monkeypatch):
    from toy import build_tokenizer

    rec = {"learn": [], "gen": []}
    real_load_data, real_learn = run_setup.load_data, train.learn

    def load_data(args, *a, **kw):
        train_set, evals = real_load_data(args, *a, **kw)
        fixed = FixedRollouts(build_tokenizer(), train_set)

        def generate(*g, **kw):
            out = fixed(*g, **kw)
            rec["gen"].append({"budgets": list(g[3]), "rows": out})
            return out

        rec["records"] = train_set
        monkeypatch.setattr(train, "generate_groups", generate)
        return train_set, evals

    def learn(run, step, got, group_ids, advantages):
        rec["learn"].append({"prompt_idx": list(got.roll.prompt_idx), "completion_ids": list(got.completion_ids),
                             "rewards": list(got.rewards), "group_ids": group_ids.tolist()})
        return real_learn(run, step, got, group_ids, advantages)

    monkeypatch.setattr(run_setup, "load_data", load_data)
    monkeypatch.setattr(train, "learn", learn)
    flags = BASE + ["--allocator", "coba", "--pass-rate-source", "oracle", "--oracle-samples", str(ORACLE_K),
                    "--steps", "2", "--output-dir", str(tmp_path)]
    train.main(flags)
    steps = [r for r in checkpoint.read_log(tmp_path / "log.jsonl") if r["type"] == "train"]
    M, B_total = 8, 32
    gen = [g for g in rec["gen"] if g["budgets"] != [1] * len(g["budgets"])]  # the greedy eval asks 1 each
    assert [g["budgets"] for g in gen[0::2]] == [[ORACLE_K] * M] * 2  # each step: the oracle's round first ...
    for s, (r, oracle, training, learnt) in enumerate(zip(steps, gen[0::2], gen[1::2], rec["learn"])):
        assert training["budgets"] == r["budgets"] and sum(r["budgets"]) == B_total  # ... then the step's B_i
        # not counted: the run's rollouts grow by B_total a step; the oracle's are logged apart
        assert r["rollouts"] == (s + 1) * B_total and r["step_rollouts"] == B_total
        assert r["oracle_rollouts"] == M * ORACLE_K and r["oracle_seconds"] >= 0
        # the allocator was handed the oracle's successes / K, every prompt counted as seen
        idx = r["prompt_idx"]
        assert r["pass_rates"] == [round(sum(is_correct(j, k) for k in range(ORACLE_K)) / ORACLE_K, 4) for j in idx]  # exact: int / int then round(., 4), the log's own ops
        assert r["seen"] == M
        # not trained on: the update gets exactly the training round's rows and rewards, B_i per prompt
        assert learnt["completion_ids"] == training["rows"]
        assert learnt["rewards"] == [float(is_correct(j, k)) for j, B in zip(idx, r["budgets"]) for k in range(B)]  # exact: 0/1 rewards
        assert learnt["group_ids"] == [i for i, B in enumerate(r["budgets"]) for _ in range(B)]
    # step 1 saw every prompt before (pool of 8, M = 8): the tracker's stale p_i are logged beside the oracle's
    assert steps[0]["stale_pass_rates"] == [None] * M
    assert all(p is not None for p in steps[1]["stale_pass_rates"])


@pytest.mark.parametrize("extra", [["--allocator", "uniform"], ["--probe"], ["--allocator", "uniform", "--dynamic-sampling"]])
def test_oracle_refuses_arms_that_draw_their_own_pass_rates(extra, capsys):
    ap = train.build_parser()
    with pytest.raises(SystemExit):
        train.resolve_args(ap.parse_args(["--pass-rate-source", "oracle", *extra]), ap)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--pass-rate-source oracle" in err and "--allocator coba" in err


# ----------------------------------------------------------------------------------------------
# The presets
# ----------------------------------------------------------------------------------------------
def resolved(preset: str, arm: str):
    args, train_flags = compare.parse_args(["--preset", preset])
    extra = [*args.regime_flags, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
             "--model", args.model]
    return args, compare.expected_config(compare.train_argv(arm, 0, extra))


def test_breadth_depth_preset_keeps_b_total_and_changes_m_and_g():
    shapes = []
    for arm in compare.PRESETS["breadth-depth"]["arms"]:
        args, cfg = resolved("breadth-depth", arm)
        assert (args.model, args.steps, cfg["allocator"], cfg["total_budget"]) == ("toy-reason", 40, "uniform", 256)
        shapes.append((cfg["prompts_per_step"], cfg["num_generations"]))
    assert shapes == [(16, 16), (32, 8), (64, 4), (128, 2)]


def test_paper_regime_preset_is_the_scaled_paper_setting():
    args, cfg = resolved("paper-regime", "coba-oracle")
    assert (args.steps, args.eval_every, args.model) == (120, 20, "toy-reason")
    assert (cfg["prompts_per_step"], cfg["num_generations"], cfg["max_budget"], cfg["train_size"]) == (16, 16, 128, 128)
    assert cfg["pass_rate_source"] == "oracle" and cfg["allocator"] == "coba"
    assert set(compare.PRESETS["paper-regime"]["arms"]) >= {"uniform", "coba", "coba-released", "knapsack", "dapo",
                                                           "coba-oracle"}
    assert args.runs_out.name == "model-toy-reason-paper-regime"  # its runs never meet other sweeps' of the lab


def test_mechanism_figure_takes_every_committed_run_once(tmp_path):
    """plots.py --mechanism-figure: one point per run over every table under RESULTS; a run two tables
    hold (uniform reused by an ablation) counts once; one panel per lab with its rank correlation."""
    import plots

    def table(folder: str, model: str, runs: list[tuple[str, int, float, float]]):
        d = tmp_path / "results" / folder
        d.mkdir(parents=True)
        (d / "compare.jsonl").write_text(json.dumps({"type": "config", "model": model}) + "\n")
        (d / "runs.jsonl").write_text("".join(json.dumps(
            {"type": "run", "arm": arm, "seed": seed, "rollouts": [0, 8], "acc": [0.2, 0.2 + gain],
             "start_acc": 0.2, "final_acc": 0.2 + gain, "signal_prompts": sig, "metric": "avg@8"}) + "\n"
            for arm, seed, gain, sig in runs))

    table("headline-toy-reason", "toy-reason", [("uniform", 0, 0.25, 21.0), ("coba", 0, 0.20, 11.0),
                                                ("dapo", 0, 0.27, 32.0)])
    table("ablation-toy-reason", "toy-reason", [("uniform", 0, 0.25, 21.0), ("coba:fixed(1.5,10.5)", 0, 0.10, 10.0),
                                                ("coba:fixed(10.5,1.5)", 0, 0.15, 12.0)])
    table("headline", "toy", [("uniform", 0, 0.05, 17.0), ("coba", 0, 0.04, 9.0), ("coba", 1, 0.045, 9.5)])
    runs = plots.once_each(plots.committed_runs(tmp_path / "results"))
    assert sorted((r["lab"], r["arm"]) for r in runs) == sorted(
        [("toy-reason", "uniform"), ("toy-reason", "coba"), ("toy-reason", "dapo"),
         ("toy-reason", "coba:fixed(1.5,10.5)"), ("toy-reason", "coba:fixed(10.5,1.5)"), ("toy", "uniform"),
         ("toy", "coba"), ("toy", "coba")])
    path, lines = plots.mechanism_figure(tmp_path / "results", tmp_path / "fig.png")
    assert path.stat().st_size > 0
    assert lines[0].startswith("toy-reason: 5 runs from 2 tables, Spearman rho (gain, signal prompts) +0.90")
    assert lines[1].startswith("toy: 3 runs from 1 tables, Spearman rho (gain, signal prompts) +1.00")
    # and within each sweep of a lab with several (uniform, reused by the ablation, counts in both)
    assert lines[2:] == ["  toy-reason, ablation-toy-reason: 3 runs, Spearman rho +1.00",
                         "  toy-reason, headline-toy-reason: 3 runs, Spearman rho +1.00"]
