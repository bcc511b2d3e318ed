"""train.main with test hooks, for tests/test_dist.py to launch (python, or torchrun with 2 processes).

    COBA_TEST_FIXED_ROLLOUTS=1  rollouts are test_step.FixedRollouts (known rows, whichever rank makes
                                them), and each rank writes the budgets of its sampling calls to
                                OUTPUT_DIR/calls-rank<r>.json; the greedy evaluation stays real
    COBA_TEST_KILL_STEP=k       rank 1 kills itself (SIGKILL: no handler, no cleanup) as step k begins
    COBA_TEST_VERIFY_COUNTS=1   each rank's verifier counts, per sampling call, rank + 1 timeouts and
                                10 x (rank + 1) errors (its rewards unchanged), so that a step record's
                                verify_timeouts / verify_errors say whose counts they hold
    COBA_TEST_SGD=1             plain SGD instead of AdamW, so that the weights after a step are the
                                gradient times lr: Adam's first step, lr * g / (|g| + eps), turns the
                                float32 rounding noise of a gradient entry near 0 into a +/-lr move
Everything else is train.py's own command line. Not a test file (pytest collects test_*.py only)."""
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import train  # noqa: E402

from harness import run as run_setup


def fixed_rollouts(out: Path) -> None:
    from test_step import FixedRollouts
    from toy import build_tokenizer

    real_load_data, real_generate_groups = run_setup.load_data, train.generate_groups

    def load_data(args, *a, **kw):
        train_set, evals = real_load_data(args, *a, **kw)
        fixed = FixedRollouts(build_tokenizer(), train_set)
        rank = int(os.environ.get("RANK", 0))

        def generate_groups(*a, **kw):
            if kw.get("greedy"):  # the held-out evaluation: the real model, greedy
                return real_generate_groups(*a, **kw)
            rows = fixed(*a, **kw)
            sampling = [c["budgets"] for c in fixed.calls if not c["greedy"]]
            (out / f"calls-rank{rank}.json").write_text(json.dumps(sampling))
            return rows

        train.generate_groups = generate_groups
        return train_set, evals

    run_setup.load_data = load_data


def kill_rank1_at(step: int) -> None:
    real_rl_step = train.rl_step

    def rl_step(run, s):
        if s + 1 == step and int(os.environ.get("RANK", 0)) == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rl_step(run, s)

    train.rl_step = rl_step


def verify_counts() -> None:
    real_rewards = train.verify.rewards
    rank = int(os.environ.get("RANK", 0))

    def rewards(*a, stats=None, **kw):
        out = real_rewards(*a, stats=stats, **kw)
        if stats is not None:  # a training step's sampling round (the evaluation passes no stats)
            stats.timeouts += rank + 1
            stats.errors += 10 * (rank + 1)
        return out

    train.verify.rewards = rewards


def sgd() -> None:
    import torch

    run_setup.make_optimizer = lambda model, args: torch.optim.SGD(model.parameters(), lr=args.learning_rate)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if os.environ.get("COBA_TEST_FIXED_ROLLOUTS"):
        fixed_rollouts(Path(argv[argv.index("--output-dir") + 1]))
    if os.environ.get("COBA_TEST_KILL_STEP"):
        kill_rank1_at(int(os.environ["COBA_TEST_KILL_STEP"]))
    if os.environ.get("COBA_TEST_SGD"):
        sgd()
    if os.environ.get("COBA_TEST_VERIFY_COUNTS"):
        verify_counts()
    train.main(argv)
