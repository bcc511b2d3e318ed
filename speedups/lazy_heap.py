"""Algorithm 1 with its values computed lazily: the heap training calls.

Accelerates allocate.allocate (the plain version: the whole value table over the reachable budgets
first, then the heap). Same pops in the same order, so the same allocation, vector for vector:
only the values no pop ever reads are skipped. Work and memory are O(M * max_i B_i), never
O(M * B_up) (M = 256, B_up = 100,000: 48 s and 1.2 GB for the whole table, 0.05 s and 0.6 MB
lazily, on 2 shared CPU cores). Equivalence test: tests/test_allocate.py
(test_lazy_heap_*). Used by arms/allocators.py (`--allocator coba`), arms/knapsack.py and
arms/released.py.

Also the benchmark of paper §3.6 / Table 4, DP vs heap vs threshold solver on the same inputs:
`python bench.py allocate [--repeats R]` (~1 min); results in docs/speed.md.
"""
from __future__ import annotations

import heapq
import time

import numpy as np

from allocate import Values, allocate_dp, budget_grid, total_value, value_columns


def allocate_lazy(value_fn: Values, num_prompts, total_budget, min_budget, max_budget, step=1) -> list[int]:
    """allocate.allocate (Algorithm 1), same arguments and result, with values computed lazily.

    The gains are computed in blocks of budget levels, only as deep as the deepest prompt goes,
    doubling the depth when a prompt reaches the last known level. The pops are the same as with the
    whole table (each prompt holds at most one heap entry, keyed (-gain, i), so the order of pops
    does not depend on when a gain was computed), hence so is the result.
    """
    M, R, D = budget_grid(num_prompts, total_budget, min_budget, max_budget, step)
    step = int(step)
    value_columns(value_fn, M, min_budget, max_budget, step, 0, 0)  # a table's shape is checked even at R = 0

    def columns(j0, j1):  # (M, j1 - j0): V_i(B_low + step j) for j in [j0, j1)
        return value_columns(value_fn, M, min_budget, max_budget, step, j0, j1)

    extra = [0] * M  # units of `step` above B_low, per prompt
    lo = int(min_budget)
    if R == 0:  # also covers B_low = B_up (D = 0)
        return [lo] * M
    depth = min(D, max(8, -(-R // M)))  # levels 0..depth known; start a little past the even share
    V = columns(0, depth + 1)  # (M, depth+1)
    gains = np.diff(V, axis=1).tolist()  # (M, depth): gains[i][j] = V_i(level j+1) - V_i(level j)
    # heapq is a min-heap, so push -gain; the index breaks ties (smallest i first)
    heap = [(-g[0], i) for i, g in enumerate(gains)]
    heapq.heapify(heap)
    for _ in range(R):  # feasibility (R <= M L) means the heap never runs dry before R units are out
        _, i = heap[0]
        extra[i] += 1
        j = extra[i]
        if j == depth < D:  # i reached the last known level: compute the next block, twice as deep
            new = min(D, 2 * depth)
            V = np.concatenate([V[:, -1:], columns(depth + 1, new + 1)], axis=1)  # (M, new - depth + 1)
            for g, more in zip(gains, np.diff(V, axis=1).tolist()):
                g.extend(more)
            depth = new
        if j < D:
            heapq.heapreplace(heap, (-gains[i][j], i))  # pop i, push its next gain: one sift
        else:
            heapq.heappop(heap)  # i is at B_up (or has every unit there is): it leaves the heap
    return [lo + step * e for e in extra]


# ----------------------------------------------------------------------------------------------
# Benchmark (paper §3.6, Table 4): DP vs heap vs threshold, one run, same inputs
# ----------------------------------------------------------------------------------------------
def _bench_case(M, total, lo, hi, rng):
    """Realistic pass rates: p_hat of 16 samples from a Beta(0.7, 0.9) difficulty, so ~10 % are
    exactly 0 or 1; eq. 9 at a mid (alpha_t, beta_t) = (5.5, 5.5) (kappa 11, F_bar = 0.5), adaptive tau."""
    import coba

    p = rng.binomial(16, rng.beta(0.7, 0.9, size=M)) / 16.0  # (M,)
    alpha_t, beta_t, tau = 5.5, 5.5, coba.adaptive_tau(p)
    C, k = coba.capability_value_coeffs(p, alpha_t, beta_t, tau)
    table = coba.capability_value(np.arange(hi + 1)[None, :], p[:, None], alpha_t, beta_t, tau)  # (M, hi+1)
    return table, C, k


def _timed(fn, repeats, min_seconds=0.25):
    """Best wall time of at least `repeats` runs; fast solvers repeat until `min_seconds` have passed
    (up to 2000 runs), so a sub-millisecond time is not one noisy sample on a shared machine."""
    times, out, start = [], None, time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_seconds and len(times) < 2000):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


BENCH_SIZES = [(16, 128, 2, 32), (64, 1024, 2, 64),
               (512, 8192, 2, 128),     # paper Table 4
               (5120, 81920, 2, 128)]   # 10x Table 4; its DP takes about a minute, so it runs once


def bench(repeats: int = 3, dp_repeats_big: int = 1, seed: int = 0, sizes=BENCH_SIZES) -> list[dict]:
    """Wall times of DP, heap (allocate_lazy, what training calls) and threshold on the same inputs
    (best of `repeats`; the DP at M > 1000 runs `dp_repeats_big` times), their ratios and the largest
    relative objective difference. sizes: (M, B_total, B_low, B_up) tuples."""
    from speedups.threshold import allocate_threshold

    rng = np.random.default_rng(seed)
    header = (f"{'M':>5} {'B_total':>7} {'B range':>9} {'DP s':>8} {'heap s':>8} {'thresh s':>9} "
              f"{'DP/heap':>8} {'DP/thr':>8} {'heap/thr':>8}  objectives agree (max rel diff)")
    print(header, flush=True)
    rows = []
    for M, total, lo, hi in sizes:
        table, C, k = _bench_case(M, total, lo, hi, rng)
        big = M > 1000
        t_dp, b_dp = _timed(lambda: allocate_dp(table, M, total, lo, hi), dp_repeats_big if big else repeats,
                            min_seconds=0.0)
        t_heap, b_heap = _timed(lambda: allocate_lazy(table, M, total, lo, hi), repeats)
        t_thr, b_thr = _timed(lambda: allocate_threshold(C, k, total, lo, hi), repeats)
        objs = [total_value(table, b) for b in (b_dp, b_heap, b_thr)]
        rel = (max(objs) - min(objs)) / max(abs(objs[0]), 1e-300)
        row = dict(M=M, total=total, lo=lo, hi=hi, dp_s=t_dp, heap_s=t_heap, threshold_s=t_thr,
                   dp_over_heap=t_dp / t_heap, dp_over_threshold=t_dp / t_thr,
                   heap_over_threshold=t_heap / t_thr, max_rel_diff=rel, agree=rel <= 1e-9)
        rows.append(row)
        note = f" (DP timed {dp_repeats_big}x)" if big else ""
        print(f"{M:>5} {total:>7} {f'[{lo},{hi}]':>9} {t_dp:>8.3f} {t_heap:>8.4f} {t_thr:>9.5f} "
              f"{row['dp_over_heap']:>8.0f} {row['dp_over_threshold']:>8.0f} {row['heap_over_threshold']:>8.1f}  "
              f"{'yes' if row['agree'] else 'NO'} ({rel:.1e}){note}", flush=True)
    print(f"times: best of {repeats} runs (DP at M > 1000: {dp_repeats_big}; heap and threshold: as many as fit "
          f"in 0.25 s, >= {repeats}); the solvers get the same "
          f"precomputed inputs (value table for DP and heap, (C, k) for the threshold solver).\n"
          f"Paper Table 4 (M = 512, B_total = 8192): DP 115.05 s, heap 0.124 s (~928x), hardware not stated.")
    for row in rows:
        if (row["M"], row["total"], row["lo"], row["hi"]) == (512, 8192, 2, 128):  # the targets at Table 4 scale
            met = row["dp_over_heap"] >= 50 and row["dp_over_threshold"] >= 1000 and row["heap_over_threshold"] >= 10
            print(f"targets at Table 4 scale: heap >= 50x DP: {row['dp_over_heap']:.0f}x; threshold >= 1000x DP: "
                  f"{row['dp_over_threshold']:.0f}x; threshold >= 10x heap: {row['heap_over_threshold']:.1f}x; "
                  f"{'all met' if met else 'NOT all met'}")
    return rows
