"""Stress the 2-rank teardown: repeat tests/test_dist.py's plain torchrun run under load, count aborts.

    OMP_NUM_THREADS=1 python tests/stress_dist.py --runs 30 --busy 2          # 30 runs beside 2 busy loops
    OMP_NUM_THREADS=1 python tests/stress_dist.py --runs 30 --busy 2 --fsdp   # the --fsdp run instead

Each run is the launch test_killed_rank_leaves_checkpoint_whole_and_resume_is_exact starts first
(`python -m torch.distributed.run --standalone --nproc_per_node 2 tests/dist_worker.py` + test_dist.BASE,
real HF sampling and AdamW), shortened to --steps (default 1) so that most of its time is start-up and
teardown, where the abort was seen. --busy N starts N python busy loops (one CPU core each) for the
whole stress, on top of whatever else loads the machine. One line per run (exit code, seconds, and
whether stderr holds "terminate called" / a signal), then the counts. Exit status 1 if any run failed.

Not a test: pytest collects test_*.py only (setup.cfg), and this file is stress_dist.py. Docs:
docs/testing.md, "Teardown under load".
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

BUSY = "while True: pass"


def classify(p: subprocess.CompletedProcess) -> str:
    """'ok', 'abort' (a rank's std::terminate / SIGABRT), or 'exit <code>' for any other failure."""
    if p.returncode == 0 and "terminate called" not in p.stderr:
        return "ok"
    if "terminate called" in p.stderr or "SIGABRT" in p.stderr or "Signal 6" in p.stderr:
        return "abort"
    return f"exit {p.returncode}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--busy", type=int, default=2, help="python busy loops beside the runs (one core each)")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="write each failed run's stderr here")
    args = ap.parse_args(argv)

    from test_dist import BASE, WORKER  # the very command line the tests launch

    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    counts: collections.Counter = collections.Counter()
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       WORKER, *BASE, "--steps", str(args.steps), "--output-dir", str(Path(tmp) / "run"),
                       *(["--fsdp"] if args.fsdp else [])]
                t0 = time.time()
                p = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT,
                                   capture_output=True, text=True, timeout=1200)
                kind = classify(p)
            counts[kind] += 1
            print(f"run {i + 1:3d}/{args.runs}: {kind:8s} rc={p.returncode} {time.time() - t0:5.1f} s", flush=True)
            if kind != "ok":
                tail = p.stderr[-2500:]
                print("    " + tail.replace("\n", "\n    "), flush=True)
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"run{i + 1}.stderr").write_text(p.stderr)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"{args.runs} runs, {args.busy} busy loops, load average {os.getloadavg()[0]:.1f}: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0 if counts["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
