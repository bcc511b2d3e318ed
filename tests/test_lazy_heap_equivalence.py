"""The lazy heap (speedups/lazy_heap.py:allocate_lazy, what training calls) against Algorithm 1
(allocate.allocate, the whole value table first) on cases built to reach the part where the two
differ: the table extension (a prompt reaching the last known budget level, so the next block of
levels is computed). Issue 54, part 3.

allocate_lazy's contract (its docstring): the same pops in the same order as allocate.allocate,
hence the same allocation, vector for vector, for ANY values (ties broken by the smaller prompt
index in both). So every case compares the two vectors; on concave values both also reach the exact
DP's objective (App. A, Prop. 2.2); on non-concave values the greedy is only a heuristic, so there
the reference is the plain heap alone, never the DP.

The cases force what tests/test_allocate.py's random lazy tests rarely reach (few of their cases
extend the table, and none with a step > 1): a surplus R above the initial 8 levels, a dominant
prompt that outgrows the initial table, steps 1 to 3 with the off-grid table entries filled with
junk (a solver that reads budgets off the step grid reads junk), exactly tied gains (small
integers), and non-concave values (random gain orders and non-monotone values). The test counts
what the cases exercised, from the solver's own calls (a spy on lazy_heap.value_columns), and
asserts those counts, so it cannot silently stop testing the extension.

Broken versions these tests fail on (each applied to a clean copy of the code, never committed):
  - the extension columns read with step 1 instead of the real step (tests/test_allocate.py's lazy
    tests pass it);
  - a prompt leaving the heap one level early (`if j < D - 1`, or only where D = R, or only once
    the table has been extended), or at the last known level instead of extending the table;
  - the extension block shifted by one level (columns(depth, new)), or without its overlap column;
  - the depth not updated after an extension.
Run: python -m pytest -q tests/test_lazy_heap_equivalence.py  (about a second, no model)
"""
from collections import Counter

import numpy as np
import pytest

import allocate as A
from speedups import lazy_heap


def case_table(rng, M, lo, step, L, concave, ties):
    """(M, B_up + 1) value table, B_up = lo + step L. Only the step grid lo + step j carries the values
    the solvers may read; every other entry is junk (>= 0, so still a valid table). A prompt's scale
    spans three decades, so a dominant prompt takes far more than the even share of the surplus.
    ties: integer gains from {0,..,3} times an integer scale (exactly equal gains within and across
    prompts, exact sums). concave: gains sorted non-increasing; else random order, and half of
    the non-concave cases are non-monotone (values drawn per level, so gains may be negative)."""
    hi = lo + step * L
    if ties:
        scale = rng.choice([1, 2, 3, 50], size=M).astype(float)
        gains = rng.integers(0, 4, size=(M, L)).astype(float) * scale[:, None]
    else:
        scale = 10 ** rng.uniform(0, 3, size=M)
        gains = rng.exponential(size=(M, L)) * scale[:, None]
    if concave:
        gains = -np.sort(-gains, axis=1)
    levels = np.concatenate([np.zeros((M, 1)), np.cumsum(gains, axis=1)], axis=1)  # (M, L+1)
    if not concave and rng.random() < 0.5:  # non-monotone: values drawn per level
        draw = rng.integers(0, 6, size=(M, L + 1)) if ties else rng.uniform(0, 1, size=(M, L + 1))
        levels = draw * scale[:, None]
    table = rng.uniform(0, levels.max() + 1, size=(M, hi + 1))  # off-grid junk
    table[:, lo + step * np.arange(L + 1)] = levels
    return table


def random_forcing_case(rng):
    """(M, total, lo, hi, step, L), 2 <= M <= 6 (one prompt starts with every level: nothing to
    extend). The surplus R = (total - M lo) / step: mostly over [9, M L / 2], so the even share stays
    well below the deepest level a dominant prompt reaches; a fifth R in [9, L), where D = min(L, R) =
    R cuts the deepest level below B_up; a tenth every prompt at B_up (R = M L: nothing to extend,
    every prompt leaves the heap at its last level)."""
    M = int(rng.integers(2, 7))
    step = int(rng.choice([1, 2, 3]))
    lo = int(rng.integers(0, 4))
    L = int(rng.choice([12, 20, 33, 70]))
    u = rng.random()
    R = M * L if u < 0.1 else int(rng.integers(9, L)) if u < 0.3 else int(rng.integers(9, M * L // 2 + 1))
    return M, lo * M + step * R, lo, lo + step * L, step, L


def test_lazy_heap_equals_algorithm_1_where_the_table_extends(monkeypatch):
    calls = []  # (j0, j1) of every value_columns call the lazy heap makes, per case
    real = lazy_heap.value_columns

    def spy(value_fn, M, lo, hi, step, j0, j1):
        calls.append((j0, j1))
        return real(value_fn, M, lo, hi, step, j0, j1)

    monkeypatch.setattr(lazy_heap, "value_columns", spy)
    rng = np.random.default_rng(54)
    seen = Counter()
    for case in range(300):
        M, total, lo, hi, step, L = random_forcing_case(rng)
        concave, ties = case % 2 == 0, case % 3 == 0
        table = case_table(rng, M, lo, step, L, concave, ties)
        # half the cases pass a value function (train.py's call), half the table itself
        values = table if case % 4 < 2 else (lambda B, t=table: t[np.arange(len(B)), B])
        calls.clear()
        b_lazy = lazy_heap.allocate_lazy(values, M, total, lo, hi, step)
        b_heap = A.allocate(table, M, total, lo, hi, step)
        what = (case, M, total, lo, hi, step, concave, ties)
        assert b_lazy == b_heap, what  # integers: the same pops give the same vector, tie order included
        assert all(isinstance(x, int) for x in b_lazy) and sum(b_lazy) == total, what
        if concave:  # the greedy is optimal (Prop. 2.2); non-concave: a heuristic, the DP is no reference
            v_dp = A.total_value(table, A.allocate_dp(table, M, total, lo, hi, step))
            # tolerance: the same values summed in another order (1e-12 relative to objectives up to ~1e5)
            assert A.total_value(table, b_lazy) == pytest.approx(v_dp, rel=1e-12, abs=1e-9), what
        extensions = sum(j0 > 0 for j0, _ in calls)  # blocks computed after the first (the extension)
        D = min(L, (total - M * lo) // step)
        deepest = max((b - lo) // step for b in b_lazy)
        seen["cases"] += 1
        seen["full"] += total == M * hi  # every prompt at B_up: each leaves the heap at its last level
        if extensions:
            seen["extends"] += 1
            seen["extends_twice"] += extensions >= 2
            seen["extends_step>1"] += step > 1
            seen["extends_ties"] += ties
            seen["extends_non_concave"] += not concave
            seen["extends_non_concave_ties"] += (not concave) and ties
            seen["extends_value_fn"] += callable(values)
            seen["extends_to_D"] += deepest == D  # a prompt reached the last level there is
            seen["extends_D_is_R"] += D < L and deepest == D  # ... where D = R cuts below B_up
    # what the 300 cases exercised (measured with this seed, numpy 2: extends 237, twice 89, step > 1
    # 148, ties 73, non-concave 112, non-concave with ties 32, value function 121, a prompt at D 87 (at
    # B_up 45, at D = R < L 42), every prompt full 26); the bounds (~2/3) leave room for another numpy's
    # random streams, never for a generator that stops reaching the extension
    assert seen["extends"] >= 180, seen
    assert seen["extends_twice"] >= 60, seen
    assert seen["extends_step>1"] >= 100, seen
    assert seen["extends_ties"] >= 50, seen
    assert seen["extends_non_concave"] >= 75, seen
    assert seen["extends_non_concave_ties"] >= 20, seen
    assert seen["extends_value_fn"] >= 80, seen
    assert seen["extends_to_D"] >= 60, seen
    assert seen["extends_to_D"] - seen["extends_D_is_R"] >= 30, seen  # a prompt at B_up after extending
    assert seen["extends_D_is_R"] >= 25, seen
    assert seen["full"] >= 15, seen


def test_lazy_heap_extension_by_hand_with_step_and_ties():
    """One case small enough to redo by hand. step 2, B_low 1, B_up 1 + 2 x 20 = 41 (L = 20 levels);
    2 prompts, surplus 2 x 14 = 28 rollouts = 14 units, so the lazy heap starts with 8 levels (max(8,
    ceil(14 / 2))) and must extend. Prompt 0 gains 3 for 4 units, then 2; prompt 1 gains 3, then 0.
    Pops: prompt 0 four times (its 3 ties prompt 1's 3: the smaller index first), prompt 1 once (3 > 2),
    then prompt 0 the 9 remaining units (2 > 0), past level 8: prompt 0 at 13 units (1 + 26 = 27),
    prompt 1 at 1 unit (1 + 2 = 3). Off-grid entries are 100: reading budgets with step 1 past level 8
    would see them."""
    M, lo, step, L = 2, 1, 2, 20
    hi = lo + step * L
    table = np.full((M, hi + 1), 100.0)
    grid = lo + step * np.arange(L + 1)
    j = np.arange(L + 1)
    table[0, grid] = 3.0 * np.minimum(j, 4) + 2.0 * np.maximum(j - 4, 0)
    table[1, grid] = 3.0 * np.minimum(j, 1)
    assert lazy_heap.allocate_lazy(table, M, M * lo + step * 14, lo, hi, step) == [27, 3]
    assert A.allocate(table, M, M * lo + step * 14, lo, hi, step) == [27, 3]
    # every unit there is: both at B_up (each prompt must stay in the heap to its last level)
    assert lazy_heap.allocate_lazy(table, M, M * hi, lo, hi, step) == [hi, hi]
