"""Hand-made one-line mutants of the wiring issue 41 asked to protect: MoPPS's decay and draws, DAPO's
blocks and dropped groups in the log, rank seeding, metric sums over ranks, and the mode (eval/train)
of every forward. A benchmark of the tests (docs/testing.md has the table), not part of CI; not collected
by pytest (not test_*.py).

    python tests/wiring_mutants.py                      # every mutant, ~20 min on 2 cores
    python tests/wiring_mutants.py dapo-kept-count ...  # some

Each mutant replaces one exact line (it must occur once: when the code moves, the mutant says so and
stops) in a clean copy of the committed tree (`git archive HEAD` into a temporary folder, so uncommitted
edits never leak in), runs the tests of its part with `pytest -x`, and prints one JSON line: killed or
not, and the first failing test. Each part's tests are the ones that kill its mutants (see docs/testing.md
for the wider files the first pass ran).
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tests each part's mutants run against (files, then an optional -k selection)
ONE = "tests/test_arms_dapo_mopps.py"  # the arms in one process
SEED = "tests/test_dist.py -k own_seed"
SUMS = "tests/test_dist.py -k two_ranks_give_one_process or vllm_gap or gathers_every"  # 2 launches + 2 in-process
MODE = "tests/test_lora.py tests/test_step.py"
# (name, file, the exact text replaced, its replacement, tests)
M = [
    # MoPPS: decay and draws reaching the sampler
    ('mopps-decay-dropped', 'harness/data.py',
     'MoPPSSampler(n, args.seed, args.mopps_ratio, args.mopps_decay)',
     'MoPPSSampler(n, args.seed, args.mopps_ratio)', ONE),
    ('mopps-record-no-decay', 'harness/data.py',
     'mopps_update(alpha, beta, float(s), float(n), self.decay)',
     'mopps_update(alpha, beta, float(s), float(n))', ONE),
    ('mopps-draws-not-counted', 'harness/data.py',
     '        self.draws += 1\n',
     '', ONE),
    ('mopps-rng-ignores-draw', 'harness/data.py',
     'np.random.default_rng([self.seed, self.draws])',
     'np.random.default_rng([self.seed, 0])', ONE),
    ('mopps-posterior-not-fed', 'train.py',
     '    run.sampler.record(*visits[:3])\n',
     '', ONE),
    ('mopps-theta-not-logged', 'harness/data.py',
     'return {"mopps_theta": [round(t, 4) for t in self.last_draws]}',
     'return {}', ONE),
    # DAPO: blocks and dropped groups reaching the log (dynamic_sampling.DynamicBatch, arms/steps.py DapoRefill)
    ('dapo-kept-count', 'arms/dynamic_sampling.py',
     '"dapo_kept_groups": len(self.kept)',
     '"dapo_kept_groups": len(self.generated)', ONE),
    ('dapo-surplus-dropped', 'arms/dynamic_sampling.py',
     '"dapo_surplus_groups": self.surplus_groups',
     '"dapo_surplus_groups": 0', ONE),
    ('dapo-reward-over-kept', 'arms/dynamic_sampling.py',
     '        return [r for g in self.generated for r in g.rewards]',
     '        return [r for g in self.kept for r in g.rewards]', ONE),
    ('dapo-groups-over-kept', 'arms/dynamic_sampling.py',
     '"step_rollouts": self.rollouts, "step_groups": len(self.generated),',
     '"step_rollouts": self.rollouts, "step_groups": len(self.kept),', ONE),
    ('dapo-visits-kept-only', 'arms/dynamic_sampling.py',
     '        g = self.generated\n',
     '        g = self.kept\n', ONE),
    ('dapo-block-counter-reset', 'arms/steps.py',
     'run.counters["blocks"] = blocks + dyn.blocks',
     'run.counters["blocks"] = dyn.blocks', ONE),
    ('dapo-no-limit-as-one', 'arms/dynamic_sampling.py',
     'limit = max_blocks if max_blocks > 0 else None',
     'limit = max(max_blocks, 1)', ONE),
    # rank seeding
    ('seed-rank-same-seed', 'engines/dist.py',
     '        torch.manual_seed(seed * 1_000_003 + r)',
     '        torch.manual_seed(seed)', SEED),
    ('seed-rank-call-dropped', 'harness/run.py',
     '    dist.seed_rank(args.seed)  # ... and samples its own rollouts (rank 0 keeps --seed)\n',
     '', SEED),
    ('seed-rank-eval-dropped', 'harness/evaluate.py',
     '        dist.seed_rank(run.args.seed)  # under torchrun each rank samples its own share of the problems\n',
     '', SEED),
    ('seed-rank-0-reseeded', 'engines/dist.py',
     '    if r > 0:\n        torch.manual_seed(seed * 1_000_003 + r)',
     '    if r >= 0:\n        torch.manual_seed(seed * 1_000_003 + r)', SEED),
    # metric averaging over ranks (engines/update.py:policy_update)
    ('sums-grad-norm-summed', 'engines/update.py',
     'sums = dist.all_reduce_sums(sums, keep=("grad_norm",))',
     'sums = dist.all_reduce_sums(sums)', SUMS),
    ('sums-local-weight', 'engines/update.py',
     'w = float(cmask[rows].sum()) / max(float(lengths.sum()), 1.0)',
     'w = float(cmask[rows].sum()) / max(float(cmask.sum()), 1.0)', SUMS),
    ('sums-not-reduced', 'engines/update.py',
     'sums = dist.all_reduce_sums(sums, keep=("grad_norm",))',
     'sums = dict(sums)', SUMS),
    ('gap-not-reduced', 'engines/update.py',
     'sampler_gap_means(*dist.all_reduce_sums(dict(enumerate(gap))).values(), cap=cap)',
     'sampler_gap_means(*gap, cap=cap)', SUMS),
    ('eval-not-gathered', 'harness/evaluate.py',
     'zip(*dist.gather_object((greedy, sampled))))',
     'zip(*[(greedy, sampled)]))', SUMS),
    # the mode in which pi_old (and pi_ref, and the sampler's log-probs) is computed
    ('old-in-train-mode', 'engines/update.py',
     '    model.eval()  # pi_old and pi_ref without dropout',
     '    model.train()  # pi_old and pi_ref without dropout', MODE),
    ('update-in-eval-mode', 'engines/update.py',
     '    model.train()\n    return old_logps, ref_logps',
     '    model.eval()\n    return old_logps, ref_logps', MODE),
    ('generate-in-train-mode', 'engines/rollout.py',
     '    model.eval()\n    stop = eos_ids(model, tokenizer)',
     '    model.train()\n    stop = eos_ids(model, tokenizer)', MODE),
]


def run(tree: Path, mid: str, f: str, old: str, new: str, tests: str) -> dict:
    path = tree / f
    src = path.read_text()
    if src.count(old) != 1:
        raise SystemExit(f"error: mutant {mid}: its line occurs {src.count(old)} times in {f}, not once: update it")
    path.write_text(src.replace(old, new))
    files, _, k = tests.partition(" -k ")
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files.split(),
                            *(["-k", k] if k else [])], cwd=tree, capture_output=True, text=True,
                           env={**os.environ, "COBA_CACHE": str(tree / ".cache")})
    finally:
        path.write_text(src)
    # ERROR: a fixture failed (e.g. a two-rank launch crashed), which kills the mutant too
    failed = [line.split()[1] for line in p.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"id": mid, "file": f, "tests": tests, "killed": p.returncode != 0, "first_failure": failed[:1],
            "seconds": round(time.time() - t0)}


def main(ids: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for mid, f, old, new, tests in M:
            if not ids or mid in ids:
                print(json.dumps(run(tree, mid, f, old, new, tests)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
