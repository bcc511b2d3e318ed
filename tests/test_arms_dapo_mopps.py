"""The comparison arms of issue 36 (docs/arms.md): DAPO's dynamic sampling, MoPPS's prompt selection,
mopps+coba, equal rollouts, and adding arms to an existing sweep.

  - DAPO's refill on a hand-worked example (scripted rewards): groups kept, surplus dropped, rollouts
    counted, the partial batch at the block limit; then its wiring in train.py on known rollouts;
  - MoPPS's posterior update and Thompson selection against hand-computed values with fixed draws;
    its wiring (the posterior gets the same visits as CoBA's tracker); mopps+coba's allocator inputs;
  - equal rollouts: a DAPO run ends at the same rollouts as uniform, evaluated at the same counts;
  - compare.py adds arms to a sweep whose runs/ is gone (a fresh checkout) without retraining the others.
Run: python -m pytest -q tests/test_arms_dapo_mopps.py   (~1 min on one core)
"""
from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines import checkpoint
import coba
import compare
from harness import data
from arms import dynamic_sampling
from harness import stats
import train
from arms.dynamic_sampling import Group
from test_arms import check_arm, run_arm
from test_step import is_correct

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# DAPO: the refill, by hand
# ----------------------------------------------------------------------------------------------
# M = 3 prompts a block, G = 4 rollouts each. Block 0: prompt 10 all right, 11 mixed, 12 all wrong;
# block 1: 13, 14, 15 all mixed; block 2 (never reached): 16, 17, 18.
BLOCKS = [[(10, [1, 1, 1, 1]), (11, [0, 1, 0, 0]), (12, [0, 0, 0, 0])],
          [(13, [1, 0, 1, 1]), (14, [0, 0, 1, 0]), (15, [1, 1, 0, 1])],
          [(16, [0, 1, 1, 1]), (17, [1, 0, 0, 0]), (18, [0, 1, 0, 1])]]


def scripted(calls: list):
    def next_block(b):
        calls.append(b)
        return [Group(j, [float(r) for r in rs]) for j, rs in BLOCKS[b]]
    return next_block


def test_dapo_refill_by_hand():
    calls = []
    out = dynamic_sampling.dynamic_sample(scripted(calls), M=3, max_blocks=10)
    # block 0 keeps 11 (10 and 12 have std 0); block 1 has 13, 14, 15 with signal: 1 + 3 = 4 >= 3, stop.
    # The batch is the first 3 in generation order (11, 13, 14); 15 is surplus, dropped (verl: batch[:M*G]).
    assert calls == [0, 1]
    assert [g.prompt for g in out.kept] == [11, 13, 14] and out.surplus_groups == 1 and not out.partial
    # every generated rollout is spent: 2 blocks x 3 prompts x 4 = 24, the dropped 10, 12, 15 included
    assert out.blocks == 2 and out.rollouts == 24
    assert [g.prompt for g in out.generated] == [10, 11, 12, 13, 14, 15]
    assert (out.zero_signal_groups, out.zero_signal_rollouts) == (2, 8)  # 10 and 12


def test_dapo_partial_batch_at_the_block_limit():
    """verl raises at max_num_gen_batches; we update on what was kept (departure 1)."""
    calls = []
    out = dynamic_sampling.dynamic_sample(scripted(calls), M=3, max_blocks=1)
    assert calls == [0] and [g.prompt for g in out.kept] == [11] and out.partial
    assert out.blocks == 1 and out.rollouts == 12 and out.surplus_groups == 0


def test_has_signal_is_verls_std_rule():
    assert not dynamic_sampling.has_signal([0.0, 0.0, 0.0]) and not dynamic_sampling.has_signal([1.0, 1.0])
    assert dynamic_sampling.has_signal([0.0, 1.0]) and dynamic_sampling.has_signal([1.0])  # one rollout: verl keeps it
    with pytest.raises(ValueError, match="max_blocks >= 1"):
        dynamic_sampling.dynamic_sample(scripted([]), M=3, max_blocks=0)
    # no limit (None: train.py's --max-num-gen-batches <= 0, verl's convention): blocks until M are kept
    calls = []
    out = dynamic_sampling.dynamic_sample(scripted(calls), M=7, max_blocks=None)
    assert calls == [0, 1, 2] and len(out.kept) == 7 and not out.partial


# ----------------------------------------------------------------------------------------------
# DAPO in train.py, on known rollouts (test_step.FixedRollouts: prompt j's rows are all wrong for
# j % 4 == 0, all right for 1, mixed for 2 and 3)
# ----------------------------------------------------------------------------------------------
def expected_dapo(seed: int, n: int, M: int, G: int, max_blocks: int, max_rollouts: int, K: int):
    """Per update: (blocks of prompts, kept prompts, partial), drawing blocks of K prompts from the
    seed's order; max_blocks <= 0: no limit but the rollout budget (verl's convention)."""
    sampler, updates, spent = data.PromptSampler(n, seed), [], 0
    while spent < max_rollouts:
        limit = (max_rollouts - spent) // (K * G)
        if max_blocks > 0:
            limit = min(max_blocks, limit)
        blocks, signal = [], []
        while len(signal) < M and len(blocks) < limit:
            blocks.append(sampler.next(K))
            signal += [j for j in blocks[-1] if j % 4 in (2, 3)]
        spent += len(blocks) * K * G
        updates.append((blocks, signal[:M], len(signal) < M, max(0, len(signal) - M)))
    return updates


# (--max-num-gen-batches, --gen-batch-size K, rollouts, pool): 4 prompts x 4 rollouts a step; R = 7 blocks
# of K = 4 (an odd number: the last update is cut by the budget), or 3 blocks of K = 8 (verl's gen_batch_size
# above M, as the DAPO recipe's 3 x M) from a pool of 16, so that a block can hold more than M groups with
# signal (a surplus to drop); 0 blocks: no limit (verl's max_num_gen_batches <= 0; issue 41.5)
@pytest.mark.parametrize("max_blocks, K, R, n", [(10, 4, 7 * 16, 8), (1, 4, 7 * 16, 8), (0, 4, 7 * 16, 8),
                                                 (10, 8, 3 * 32, 16)],
                         ids=["refill", "block-limit", "no-limit", "blocks-of-2M"])
def test_dapo_wiring_in_train(tmp_path, toy_model_dir, monkeypatch, max_blocks, K, R, n):
    M, G = 4, 4
    rec = run_arm(tmp_path, monkeypatch, ["--allocator", "uniform", "--dynamic-sampling", "--prompts-per-step", "4",
                                          "--steps", "20", "--max-rollouts", str(R), "--eval-every-rollouts", "16",
                                          "--max-num-gen-batches", str(max_blocks), "--train-size", str(n)]
                  + (["--gen-batch-size", str(K)] if K != M else []))
    want = expected_dapo(0, n, M, G, max_blocks, R, K)
    assert len(rec["steps"]) == len(want) < 20  # the run ends on rollouts, before --steps
    assert rec["allocate"] == []  # DAPO's arm calls no allocator: G each
    gen = iter(rec["gen"])
    spent, visits = 0, iter(rec["update"])
    for r, (blocks, kept, partial, surplus) in zip(rec["steps"], want):
        for block in blocks:  # one generation call per block, G rollouts for each of its K prompts
            assert next(gen) == [G] * K
        spent += len(blocks) * K * G
        assert r["dapo_blocks"] == len(blocks) and r["prompt_idx"] == kept and r["dapo_partial"] == partial
        assert r["budgets"] == [G] * len(kept) and r["rollouts"] == spent and r["step_rollouts"] == len(blocks) * K * G
        # every group generated is a visit of the tracker, kept or dropped, in generation order
        up = next(visits)
        assert up["ids"] == [j for b in blocks for j in b] and up["totals"] == [G] * (K * len(blocks))
        assert up["successes"] == [float(sum(is_correct(j, k) for k in range(G))) for b in blocks for j in b]  # exact: counts of 0/1 rewards: integer-valued
        # the spent rollouts' zero-signal groups: j % 4 in (0, 1); reward and group counts over every
        # generated group, the dropped ones included; the batch's kept groups and the surplus dropped
        generated = [j for b in blocks for j in b]
        assert r["zero_signal_groups"] == sum(j % 4 in (0, 1) for j in generated)
        assert r["step_groups"] == len(generated) and r["frac_reward_zero_std"] == r["zero_signal_groups"] / len(generated)  # exact: int / int on both sides: one correctly rounded division
        assert r["reward"] == pytest.approx(np.mean([is_correct(j, k) for j in generated for k in range(G)]))
        assert (r["dapo_kept_groups"], r["dapo_surplus_groups"]) == (len(kept), surplus)
    assert next(gen, None) is None and spent == R
    # block b of the run samples with uniform GRPO's step-b seed (vLLM's request seeds; HF ignores it)
    seeds = [c["seed"] for c in rec["rollouts"].calls if not c["greedy"]]
    assert seeds == [2 * (0 * 1_000_003 + b) for b in range(sum(len(w[0]) for w in want))]
    # evaluations at every 16 rollouts, the ones inside an update of the policy before it
    log = checkpoint.read_log(tmp_path / "log.jsonl")
    evals = [r for r in log if r["type"] == "eval"]
    assert [e["rollouts"] for e in evals] == list(range(0, R + 1, 16))
    ends = {r["rollouts"] for r in rec["steps"]}
    assert all(e.get("before_update", False) == (e["rollouts"] not in ends and e["rollouts"] > 0) for e in evals)
    summary = log[-1]
    assert summary["type"] == "summary" and summary["step"] == len(want) and summary["rollouts"] == R
    if max_blocks == 1:
        assert any(w[2] for w in want), "fixture must hit the block limit"
    if max_blocks == 0:  # without a limit an update refills past 1 block where the budget allows
        assert max(len(w[0]) for w in want) > 1 and not want[0][2]
    if K > M:
        assert any(w[3] for w in want), "fixture must drop surplus groups"


def test_dapo_finished_run_is_recognised_on_resume(tmp_path, toy_model_dir, monkeypatch):
    """A run that ended on --max-rollouts before --steps is finished: --resume adds nothing."""
    flags = ["--allocator", "uniform", "--dynamic-sampling", "--prompts-per-step", "4", "--steps", "20",
             "--max-rollouts", "48", "--eval-every-rollouts", "16"]
    run_arm(tmp_path, monkeypatch, flags)
    before = (tmp_path / "log.jsonl").read_text()
    from test_step import BASE
    summary = train.main(BASE + ["--num-mini-batches", "1"] + flags + ["--output-dir", str(tmp_path), "--resume"])
    assert (tmp_path / "log.jsonl").read_text() == before and summary["rollouts"] == 48


# ----------------------------------------------------------------------------------------------
# MoPPS: posterior and selection, by hand
# ----------------------------------------------------------------------------------------------
def test_mopps_posterior_update_by_hand():
    # Beta(1, 1), 3 of 4 right, lambda = 1: (1 + 3, 1 + 1) = (4, 2)
    assert data.mopps_update(1.0, 1.0, 3, 4) == (4.0, 2.0)  # exact: dyadic arithmetic: no rounding
    # then 1 of 4 right with lambda = 0.5: alpha = 0.5*4 + 0.5*1 + 1 = 3.5, beta = 0.5*2 + 0.5*1 + 3 = 4.5
    assert data.mopps_update(4.0, 2.0, 1, 4, decay=0.5) == (3.5, 4.5)  # exact: dyadic arithmetic: no rounding
    # lambda = 0 forgets everything but the last visit: Beta(1 + s, 1 + n - s)
    assert data.mopps_update(40.0, 7.0, 2, 8, decay=0.0) == (3.0, 7.0)  # exact: dyadic arithmetic: no rounding


def test_mopps_selection_by_hand():
    # |theta - 0.5|: .4, .05, .3, .05, 0, .45 -> nearest first: 4, then the tie 1 and 3 (earlier first)
    assert data.mopps_select([0.9, 0.45, 0.2, 0.55, 0.5, 0.05], 3) == [4, 1, 3]


class FixedDraws:
    """Stands in for numpy's Generator: theta from a list, and the Beta parameters it was asked for."""

    def __init__(self, thetas, asked):
        self.thetas, self.asked = thetas, asked

    def beta(self, a, b):
        self.asked.append((list(a), list(b)))
        return np.array(self.thetas.pop(0))


def test_mopps_sampler_draws_from_the_posterior_and_keeps_the_nearest(monkeypatch):
    asked, seeds = [], []
    thetas = [[0.9, 0.45, 0.2, 0.55], [0.1, 0.5, 0.3, 0.8]]
    monkeypatch.setattr(data.np.random, "default_rng", lambda seed: seeds.append(list(seed)) or FixedDraws(thetas, asked))
    s = data.MoPPSSampler(8, seed=3, ratio=2, decay=1.0)
    order = data.PromptSampler(8, seed=3)
    cands = order.next(4)  # ratio x M = 4 candidates: the seed's epoch order
    assert s.next(2) == [cands[1], cands[3]]  # theta .45 and .55: nearest 0.5 (tie: earlier first)
    assert asked[0] == ([1.0] * 4, [1.0] * 4)  # exact: the Beta(1, 1) prior, written; unseen prompts: Beta(1, 1)
    assert s.last_draws == [0.45, 0.55]  # exact: the fake's draws, copied
    s.record([cands[1], cands[3]], [3, 0], [4, 4])  # -> Beta(4, 2) and Beta(1, 5)
    cands2 = order.next(4)
    s.posterior[cands2[0]] = (2.0, 9.0)  # as if seen before
    assert s.next(2) == [cands2[1], cands2[2]]
    assert asked[1] == ([2.0, 1.0, 1.0, 1.0], [9.0, 1.0, 1.0, 1.0])  # exact: priors and integer counts, written
    assert s.posterior[cands[1]] == (4.0, 2.0) and s.posterior[cands[3]] == (1.0, 5.0)  # exact: integer counts added to a Beta(1, 1)
    assert seeds == [[3, 0], [3, 1]] and s.draws == 2  # each step's draw from its own seed: (--seed, draw number)
    # a checkpoint round trip keeps the order, the draw count and the posteriors
    t = data.MoPPSSampler(8, seed=3, ratio=2)
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert (t.posterior, t.draws, t.order.state_dict()) == (s.posterior, s.draws, s.order.state_dict())


def test_mopps_wiring_posterior_gets_the_trackers_visits(tmp_path, toy_model_dir, monkeypatch):
    """mopps+coba: MoPPS picks the prompts (ratio x M candidates), CoBA's allocator splits the budget
    among them (check_arm: its inputs); MoPPS's posterior records exactly the tracker's visits."""
    recorded = []
    real = data.MoPPSSampler.record

    def record(self, ids, successes, totals):
        recorded.append(([int(i) for i in ids], [float(x) for x in successes], [int(n) for n in totals]))
        return real(self, ids, successes, totals)

    monkeypatch.setattr(data.MoPPSSampler, "record", record)
    rec = run_arm(tmp_path, monkeypatch, ["--allocator", "coba", "--prompt-selection", "mopps", "--mopps-ratio", "2",
                                          "--prompts-per-step", "4", "--steps", "4", "--mopps-decay", "0.5"])
    check_arm(rec)
    assert recorded == [(u["ids"], u["successes"], u["totals"]) for u in rec["update"]]
    # the posterior after the run, by hand: each visit decays (alpha, beta) halfway to Beta(1, 1) (lambda =
    # --mopps-decay 0.5), then adds the visit's right and wrong rollouts
    state = __import__("torch").load(tmp_path / "checkpoint-4" / "trainer_state.pt", weights_only=False)
    want = {}
    for u in rec["update"]:
        for j, s, n in zip(u["ids"], u["successes"], u["totals"]):
            a, b = want.get(j, (1.0, 1.0))
            want[j] = (0.5 * a + 0.5 + s, 0.5 * b + 0.5 + n - s)
    assert any(len([1 for u in rec["update"] if j in u["ids"]]) > 1 for j in want), "fixture must revisit a prompt"
    assert {int(j): tuple(v) for j, v in state["sampler"]["posterior"].items()} == want  # halves and integers: exact
    assert all(len(r["mopps_theta"]) == 4 for r in rec["steps"])


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------
def test_help_shows_the_arms():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    for flag in ("--dynamic-sampling", "--max-num-gen-batches", "--gen-batch-size", "--prompt-selection", "{sampler,mopps}",
                 "--mopps-ratio", "--mopps-decay", "--max-rollouts", "--eval-every-rollouts"):
        assert flag in out, flag
    out = subprocess.run([sys.executable, "compare.py", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "dapo" in out and "mopps" in out and "mopps+coba" in out


@pytest.mark.parametrize("flags, words", [
    (["--dynamic-sampling", "--allocator", "coba"], "--dynamic-sampling is DAPO's arm"),
    (["--max-rollouts", "100"], "--max-rollouts 100 is not a multiple of B_total = 256"),
    (["--eval-every-rollouts", "300"], "--eval-every-rollouts 300 is not a multiple"),
    (["--mopps-decay", "1.5"], "--mopps-decay must be in [0, 1]"),
    (["--dynamic-sampling", "--allocator", "uniform", "--gen-batch-size", "0"], "--gen-batch-size must be in [1, inf)"),
    (["--gen-batch-size", "96"], "--gen-batch-size is the block size of DAPO's --dynamic-sampling"),
    (["--dynamic-sampling", "--allocator", "uniform", "--gen-batch-size", "96", "--max-rollouts", "512"],
     "--max-rollouts 512 is not a multiple of a DAPO block's 768 rollouts"),
    (["--dynamic-sampling", "--allocator", "uniform", "--gen-batch-size", "5", "--total-budget", "100"],
     "--gen-batch-size 5 x B_total 100 is not a multiple of --prompts-per-step 32"),
])
def test_bad_arm_flags_are_one_line_errors(flags, words, capsys):
    with pytest.raises(SystemExit):
        ap = train.build_parser()
        train.resolve_args(ap.parse_args(flags), ap)
    assert words in capsys.readouterr().err.replace("\n", " ")


def test_mopps_candidates_must_fit_the_pool(tmp_path, toy_model_dir):
    with pytest.raises(SystemExit, match="--mopps-ratio 8 x --prompts-per-step 8 = 64 candidates .* 32 training"):
        train.main(["--model", "toy", "--prompt-selection", "mopps", "--train-size", "32", "--prompts-per-step", "8", "--steps", "1",
                    "--no-progress", "--output-dir", str(tmp_path)])
    assert not (tmp_path / "log.jsonl").exists()


def test_dapo_block_must_fit_the_pool(tmp_path, toy_model_dir):
    with pytest.raises(SystemExit, match="--gen-batch-size 64 prompts a DAPO block, more than the 32 training"):
        train.main(["--model", "toy", "--dynamic-sampling", "--allocator", "uniform", "--gen-batch-size", "64",
                    "--train-size", "32", "--prompts-per-step", "8", "--steps", "1", "--no-progress",
                    "--output-dir", str(tmp_path)])
    assert not (tmp_path / "log.jsonl").exists()


# ----------------------------------------------------------------------------------------------
# End to end on the toy model: every new arm, a few steps, the same rollouts and evaluation points
# ----------------------------------------------------------------------------------------------
TINY = ["--model", "toy", "--train-size", "32", "--prompts-per-step", "8", "--num-generations", "4",
        "--eval-size", "16", "--eval-samples", "2", "--steps", "3", "--save-every", "100", "--no-progress",
        "--mopps-ratio", "2"]


def test_each_new_arm_trains_end_to_end(tmp_path, toy_model_dir):
    ends = {}
    for arm in ("uniform", "dapo", "mopps", "mopps+coba"):
        argv = compare.train_argv(arm, 0, [*TINY, "--eval-every", "1"])
        summary = train.main([*argv, "--output-dir", str(tmp_path / arm)])
        log = checkpoint.read_log(tmp_path / arm / "log.jsonl")
        ends[arm] = ([r["rollouts"] for r in log if r["type"] == "eval"], summary["rollouts"],
                     sum(r["type"] == "train" for r in log))
    # equal rollouts: 3 x 32 each, evaluated at 0, 32, 64, 96; DAPO in at most 3 updates
    assert all(e[:2] == ([0, 32, 64, 96], 96) for e in ends.values()), ends
    assert ends["uniform"][2] == ends["mopps"][2] == ends["mopps+coba"][2] == 3 and 1 <= ends["dapo"][2] <= 3


# ----------------------------------------------------------------------------------------------
# compare.py: adding arms to an existing sweep (the brief's command), with a trainer that takes no time
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def fast_train(tmp_path, monkeypatch):
    """compare.py with test_compare's fake trainer (real flag checks: expected_config is train.py's)."""
    from test_compare import FAKE_TRAIN, plain_read_log

    path = tmp_path / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    monkeypatch.setattr(compare, "TRAIN", [sys.executable, str(path)])
    monkeypatch.setattr(compare, "read_log", plain_read_log)
    monkeypatch.setattr(compare, "prepare_model", lambda args: None)
    monkeypatch.setattr(compare, "mismatched_runs", lambda jobs, out, extra: {})  # no runs/ here to check
    return path


def test_arms_are_added_to_a_committed_sweep_without_retraining(tmp_path, fast_train):
    """results/headline-toy-strong as committed (runs.jsonl, compare.jsonl, table.md; no runs/): adding
    dapo, mopps and mopps+coba trains those 15 runs only; uniform and coba are reused from runs.jsonl
    and the other four arms stay in the table."""
    table_dir = tmp_path / "headline-toy-strong"
    table_dir.mkdir()
    for name in ("compare.jsonl", "table.md"):
        shutil.copy(ROOT / "results" / "headline-toy-strong" / name, table_dir / name)
    # as it was before these arms were added to it (issue 36's sweep added them to the committed table)
    new = ("dapo", "mopps", "mopps+coba")
    kept = [r for r in compare.read_jsonl(ROOT / "results" / "headline-toy-strong" / "runs.jsonl") if r["arm"] not in new]
    (table_dir / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    before = {(r["arm"], r["seed"]): r for r in kept}
    assert len(before) == 30
    argv = ["--preset", "headline", "--arms", "uniform", "coba", "dapo", "mopps", "mopps+coba", "--model", "toy-strong",
            "--out", str(tmp_path), "--steps", "4", "--eval-every", "2"]
    # another --steps than the committed sweep's 100: uniform's and coba's stored runs do not match
    with pytest.raises(SystemExit, match=r"10 runs .* other train.py flags .*--steps 100 -> 4"):
        compare.main(argv)
    assert not (tmp_path / "model-toy-strong").exists()  # nothing ran
    res = compare.main(argv[:-4] + ["--jobs", "4"])  # the committed sweep's own --steps and --eval-every
    ran = {p.parent.name for p in (tmp_path / "model-toy-strong" / "runs").glob("*/calls.txt")}
    assert ran == {f"{a}-seed{s}" for a in ("dapo", "mopps", "mopps+coba") for s in range(5)}
    dapo_call = (tmp_path / "model-toy-strong" / "runs" / "dapo-seed0" / "calls.txt").read_text()
    assert "--max-rollouts 25600 --eval-every-rollouts 6400" in dapo_call  # 100 and 25 steps x 32 x 8
    assert "--max-rollouts" not in (tmp_path / "model-toy-strong" / "runs" / "mopps-seed0" / "calls.txt").read_text()
    arms = {r["arm"] for r in res["runs"]}
    assert arms == {"uniform", "knapsack", "coba", "coba-released", "knapsack+probe", "coba+probe",
                    "dapo", "mopps", "mopps+coba"} and len(res["runs"]) == 45
    after = {(r["arm"], r["seed"]): r for r in compare.read_jsonl(table_dir / "runs.jsonl")}
    for key, r in before.items():  # reused as they were (uniform and coba record their flags since issue 36)
        assert {k: v for k, v in after[key].items() if k != "train_argv"} == {k: v for k, v in r.items() if k != "train_argv"}
    table = (table_dir / "table.md").read_text()
    assert "| dapo |" in table and "| knapsack+probe |" in table
    assert "Prompt order: mopps, mopps+coba choose their own prompts" in table
    # a second call finds everything finished and trains nothing
    calls = {p: p.read_text() for p in (tmp_path / "model-toy-strong" / "runs").glob("*/calls.txt")}
    compare.main(argv[:-4])
    assert {p: p.read_text() for p in (tmp_path / "model-toy-strong" / "runs").glob("*/calls.txt")} == calls


def test_table_counts_updates_where_arms_differ():
    """DAPO's arm makes fewer updates for the same rollouts: a column, and a footer line."""
    def run(arm, seed, updates, blocks):
        return {"arm": arm, "seed": seed, "final_acc": 0.5, "auc": 0.5, "rollouts": [0.0, 64.0], "acc": [0.4, 0.5],
                "zero_signal_group_share": 0.1, "zero_signal_rollout_share": 0.1, "train_seconds": 1.0,
                "prompts_at_min_budget": 1.0, "updates": updates, "blocks": blocks, "total_rollouts": 64}
    runs = [run("uniform", s, 2, 2) for s in (0, 1)] + [run("dapo", 0, 1, 2), run("dapo", 1, 2, 2)]
    summary, diffs = stats.compare_arms(runs)
    table = stats.markdown_table(summary, diffs, "avg@8", footer=compare.arm_notes(summary))
    lines = table.splitlines()
    assert lines[0].endswith("updates (same rollouts) |") and lines[2].endswith("| 2.0 |")
    assert lines[3].endswith("| 1.5 |")  # dapo: (1 + 2) / 2 updates
    # 2 blocks a run / 1.5 updates = 1.33 blocks per update
    assert "dapo ends at the same total rollouts (64) after 1.5 updates, 1.33 blocks" in table
    same = stats.markdown_table(*stats.compare_arms([run("uniform", 0, 2, 2), run("coba", 0, 2, 2)]), "avg@8")
    assert "updates" not in same  # equal steps: no column (the committed tables redraw unchanged)
