"""Tests for verify.py, the binary verifiable reward (RLVR).

Run: python -m pytest -q tests/test_verify.py    (~100 cases, ~6 s; the adversarial cases wait out 1 s timeouts)

Each rule is tested from both sides: a pair it must accept and a pair it must reject. The `check`
column says which stage must decide, so a test fails if, say, sympy starts answering what the
cheap numeric path should.
"""
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import verify
from verify import VerifyStats, extract_answer, is_equivalent, normalize, reward, rewards

ROOT = Path(__file__).resolve().parents[1]
NESTED_FRACS = r"\frac{1}{" * 30 + "2" + "}" * 30  # 361 chars, under the size cap; sympy needs minutes


# ---------------------------------------------------------------------------------------------
# 1. Extraction: boxed > gsm8k > answer_is > last_number (flag)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, fallback, expected", [
    (r"so $x = \boxed{5}$.", False, ("5", "boxed")),
    (r"\boxed{\frac{1}{2}}", False, (r"\frac{1}{2}", "boxed")),  # nested braces
    (r"\boxed{\frac{\sqrt{2}}{2}}", False, (r"\frac{\sqrt{2}}{2}", "boxed")),
    (r"\boxed{\boxed{5}}", False, ("5", "boxed")),  # a box in a box
    (r"first \boxed{1}, then \boxed{2}, finally \boxed{3}", False, ("3", "boxed")),  # last wins
    (r"\boxed{7} and a truncated \boxed{12", False, ("7", "boxed")),  # an unclosed box is skipped
    (r"\fbox{42}", False, ("42", "boxed")),
    (r"so it is \boxed 7.", False, ("7.", "boxed")),  # `\boxed ` without braces
    (r"\boxed{\{1, 2\}}", False, (r"\{1, 2\}", "boxed")),  # escaped braces are not grouping
    (r"\boxed{}", False, (None, "none")),  # an empty box is no answer
    ("He pays 3 * 400 = 1,200.\n#### 1,200", False, ("1,200", "gsm8k")),
    ("#### 18\nThe answer is 20", False, ("18", "gsm8k")),  # gsm8k outranks answer_is
    (r"#### 18 but \boxed{20}", False, ("20", "boxed")),  # boxed outranks gsm8k
    ("So the answer is 42.", False, ("42", "answer_is")),
    ("The answer is 3.5. Done", False, ("3.5", "answer_is")),  # the decimal point is no sentence end
    (r"**Answer:** $-\frac{1}{2}$", False, (r"$-\frac{1}{2}$", "answer_is")),
    ("the answer is 18 dollars a week", False, ("18", "answer_is")),
    ("We get 3 and then -5", True, ("-5", "last_number")),
    ("10-3=7", True, ("7", "last_number")),  # binary minus, not a sign
    ("x=-4", True, ("-4", "last_number")),
    ("total 1,234 apples", True, ("1,234", "last_number")),
    ("17", True, ("17", "last_number")),  # the toy task's bare integers
    ("17", False, (None, "none")),  # ... need the flag
    ("", True, (None, "none")),
    ("no digits at all", True, (None, "none")),
])
def test_extract_answer(completion, fallback, expected):
    assert extract_answer(completion, last_number_fallback=fallback) == expected


# ---------------------------------------------------------------------------------------------
# 2. Normalization (ours)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    (r"$1{,}000\text{ cm}$", "1000"),
    (r"\left( 1, 2 \right]", "(1,2]"),
    (r"\dfrac{3}{4}", r"\frac{3}{4}"),
    ("17.0", "17"),
    ("-17.000", "-17"),
    (r"90^\circ", "90"),
    (r"\$18", "18"),
    ("1,234,567", "1234567"),
    ("1,2", "1,2"),  # a pair, not a thousands separator
    (r"x \rightarrow 0", r"x\rightarrow0"),  # \right removed, \rightarrow kept
    (r"\boxed{5}", "5"),
])
def test_normalize(raw, expected):
    assert normalize(raw) == expected


# ---------------------------------------------------------------------------------------------
# 3. Equivalence: both sides of each stage, and which stage decides
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pred, ref, check", [
    ("17", "17", "exact"),
    ("-5", "-5", "exact"),
    ("1,234", "1234", "exact"),
    ("17.0", "17", "exact"),
    (r"10\text{ cm}", "10", "exact"),
    (r"\left(1, 2\right]", "(1,2]", "exact"),
    ("3/4", "0.75", "numeric"),  # 3/4 = 0.75 exactly
    (r"\frac{1}{2}", "0.5", "numeric"),
    (r"\frac12", "0.5", "numeric"),
    (r"\dfrac{3}{4}", "0.75", "numeric"),
    (r"-\frac{1}{2}", "-0.5", "numeric"),
    ("0.50", ".5", "numeric"),
    (r"50\%", "0.5", "numeric"),  # 50% = 50/100
    ("50%", "50", "numeric"),  # ... or the number of percent
    (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}", "symbolic"),
    ("(x+1)^2", "x^2+2x+1", "symbolic"),
    (r"\{3, 2, 1\}", r"\{1,2,3\}", "symbolic"),  # sets ignore order
    (r"\frac{\pi}{2}", r"\pi/2", "symbolic"),
    (r"[0, \infty)", r"[0,\infty)", "exact"),
    (r"(-\infty, 3)", r"\left(-\infty,3\right)", "exact"),
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", "exact"),
    (r"\begin{pmatrix}2/2&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", "symbolic"),
])
def test_equal_pairs(pred, ref, check):
    assert is_equivalent(pred, ref) == (True, check)


@pytest.mark.parametrize("pred, ref, check", [
    ("12", "17", "numeric"),
    ("-5", "5", "numeric"),
    ("0.333", "1/3", "numeric"),  # exact comparison: 333/1000 != 1/3
    ("3/4", "0.7", "numeric"),
    (r"\frac{1}{3}", "0.5", "numeric"),
    ("1,234", "1.234", "numeric"),  # 1234 vs 1.234
    ("50%", "0.05", "numeric"),  # neither 50 nor 0.5
    ("1/0", "0", "symbolic"),  # no division by zero on the numeric path
    (r"\sqrt{2}", r"\frac{\sqrt2}{2}", "symbolic"),
    ("(x-1)^2", "x^2+2x+1", "symbolic"),
    ("(1,2)", "(1,2]", "symbolic"),  # open vs half-open interval
    ("[1,2]", "(1,2]", "symbolic"),
    (r"\{1,2\}", r"\{1,2,3\}", "symbolic"),
    (r"\begin{pmatrix}1&2\\3&5\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", "symbolic"),
])
def test_unequal_pairs(pred, ref, check):
    assert is_equivalent(pred, ref) == (False, check)


# ---------------------------------------------------------------------------------------------
# 4. reward(): end to end, the toy path, bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, answer, expected", [
    (r"So $x = \boxed{\frac{1}{2}}$.", "0.5", 1.0),
    (r"So $x = \boxed{\frac{1}{3}}$.", "0.5", 0.0),
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("#### 1,001", "1000", 0.0),
    ("The answer is $\\sqrt{2}/2$.", r"\frac{\sqrt2}{2}", 1.0),
    (r"\boxed{(1, 2]}", r"\left(1,2\right]", 1.0),
    (r"\boxed{-7}", "-7", 1.0),
    (r"\boxed{7}", "-7", 0.0),
    (r"\boxed{\boxed{5}}", r"\boxed{5}", 1.0),  # a boxed reference is unwrapped too
])
def test_reward_end_to_end(completion, answer, expected):
    assert reward(completion, answer) == expected


def test_toy_bare_integers_with_fallback():
    assert reward("17", "17", last_number_fallback=True) == 1.0
    assert reward("-5", "-5", last_number_fallback=True) == 1.0
    assert reward("-5", "5", last_number_fallback=True) == 0.0
    assert reward(" 17\n", "17", last_number_fallback=True) == 1.0
    assert reward("17", "17") == 0.0  # without the flag nothing is extracted


def test_toy_path_is_fast_and_never_reaches_sympy():
    stats = VerifyStats()
    t0 = time.perf_counter()
    scores = rewards([str(i % 40 - 20) for i in range(2000)], ["17"] * 2000, last_number_fallback=True, stats=stats)
    elapsed = time.perf_counter() - t0
    assert sum(scores) == 2000 / 40  # i % 40 - 20 == 17 once per 40 (i % 40 == 37)
    assert set(stats.by_check) == {"exact", "numeric"}  # no "symbolic": math-verify never called
    assert elapsed < 2.0  # ~0.1 s measured (~50 us a call); 2 s leaves room for a busy machine


def test_empty_and_missing_answers_score_zero_and_are_counted():
    stats = VerifyStats()
    assert reward("", "17", stats=stats) == 0.0
    assert reward("I have no idea.", "17", last_number_fallback=True, stats=stats) == 0.0
    assert reward(None, "17", stats=stats) == 0.0  # model output that is not even a string
    assert (stats.checked, stats.correct, stats.by_check) == (3, 0, {"no_answer": 3})
    assert stats.by_rule == {"none": 3}


def test_reference_may_be_an_int_but_not_none():
    assert reward(r"\boxed{17}", 17) == 1.0
    with pytest.raises(ValueError, match="answer field"):
        reward(r"\boxed{17}", None)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        reward("17", "17", timeout_s=0)
    with pytest.raises(ValueError, match="one answer per completion"):
        rewards(["1", "2", "3"], ["1", "2"])


def test_rewards_batch_and_stats():
    stats = VerifyStats()
    completions = [r"\boxed{1}", "#### 2", "the answer is 4", "5"]
    out = rewards(completions, ["1", "2", "3", "5"], last_number_fallback=True, stats=stats)
    assert out == [1.0, 1.0, 0.0, 1.0]
    assert stats.by_rule == {"boxed": 1, "gsm8k": 1, "answer_is": 1, "last_number": 1}
    assert stats.as_dict()["correct"] == 3 and stats.timeouts == 0 and stats.errors == 0


# ---------------------------------------------------------------------------------------------
# 5. Adversarial input: size caps and the hard timeout
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("garbage", [
    "x" * 100_000,
    "1" * 100_000,  # one 32,000-digit "last number": over the answer cap, never parsed
    ("{\\frac{" * 8 + "}" * 5 + "#### ( \\boxed{" + "$" * 3) * 2_500,  # ~100 kB of broken LaTeX
])
def test_100kb_garbage_scores_zero_fast(garbage):
    assert len(garbage) >= 100_000
    stats = VerifyStats()
    t0 = time.perf_counter()
    assert reward(garbage, "1", last_number_fallback=True, stats=stats, timeout_s=1.0) == 0.0
    assert time.perf_counter() - t0 < 2.0
    assert stats.errors == 0


def test_oversize_answer_is_counted_not_parsed():
    stats = VerifyStats()
    assert reward("1" * 5000, "1", last_number_fallback=True, stats=stats) == 0.0
    assert stats.oversize == 1 and stats.by_check == {"oversize": 1}


def test_deeply_nested_latex_times_out_in_under_5_s():
    stats = VerifyStats()
    t0 = time.perf_counter()
    assert reward(rf"\boxed{{{NESTED_FRACS}}}", "1", timeout_s=1.0, stats=stats) == 0.0
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0
    assert stats.timeouts == 1 and stats.by_check == {"timeout": 1}  # the guard fired, nothing raised


def test_timeout_off_the_main_thread():
    """math-verify's own signal timeouts refuse to run here; our worker-thread guard must not."""
    stats, out = VerifyStats(), {}

    def score():
        t0 = time.perf_counter()
        out["reward"] = reward(rf"\boxed{{{NESTED_FRACS}}}", "1", timeout_s=1.0, stats=stats)
        out["elapsed"] = time.perf_counter() - t0
        out["easy"] = reward(r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt2}{2}", stats=stats)  # symbolic, in a thread

    caller = threading.Thread(target=score)
    caller.start()
    caller.join(30)
    assert out["reward"] == 0.0 and out["elapsed"] < 5.0 and out["easy"] == 1.0
    assert stats.timeouts == 1
    deadline = time.time() + 5  # the abandoned worker is stopped by the async exception
    while any(t.name == "verify-check" for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "verify-check" for t in threading.enumerate())


def test_timeout_guard_restores_signal_state():
    def spin():
        while True:
            pass

    sentinel = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGALRM, sentinel)
    try:
        t0 = time.perf_counter()
        with pytest.raises(verify._CheckTimeout):
            verify.run_with_timeout(spin, 0.2)
        assert 0.2 <= time.perf_counter() - t0 < 2.0
        assert signal.getsignal(signal.SIGALRM) is sentinel  # our handler is gone again
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no stray alarm left armed
        assert verify.run_with_timeout(lambda: 6 * 7, 0.2) == 42
        with pytest.raises(ZeroDivisionError):  # ordinary exceptions pass through; is_equivalent counts them
            verify.run_with_timeout(lambda: 1 / 0, 0.2)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_timeout_guard_keeps_an_outer_timer():
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # e.g. pytest-timeout's alarm
        verify.run_with_timeout(lambda: None, 0.5)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------
# 6. Format reward (flag, default off)
# ---------------------------------------------------------------------------------------------
def test_format_reward_is_off_by_default():
    assert reward(r"so \boxed{4}", "4") == 1.0  # exactly binary: no bonus hiding in the default


@pytest.mark.parametrize("completion, expected", [
    (r"2 + 2 = \boxed{4}", 1.0 + 0.1),  # correct and well formed
    (r"2 + 2 = $\boxed{5}$.", 0.0 + 0.1),  # wrong but well formed
    (r"\boxed{3} no, \boxed{4}", 1.0),  # two boxes: no bonus
    (r"\boxed{4} is what I think", 1.0),  # text after the box: no bonus
    ("the answer is 4", 1.0),  # no box at all
])
def test_format_reward(completion, expected):
    assert reward(completion, "4", format_reward=0.1) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# 7. The teaching CLI
# ---------------------------------------------------------------------------------------------
def test_cli_prints_answer_rule_and_reward(capsys):
    verify.main([r"so \boxed{\frac{1}{2}}", "0.5"])
    out = capsys.readouterr().out
    assert r"extracted: '\\frac{1}{2}'" in out and "rule:      boxed" in out and "reward:    1.0" in out


def test_cli_as_a_script():
    run = subprocess.run([sys.executable, str(ROOT / "verify.py"), "-5", "5", "--last-number-fallback"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "rule:      last_number" in run.stdout and "check:     numeric" in run.stdout
    assert "reward:    0.0" in run.stdout
