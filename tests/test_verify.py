"""Tests for verify.py, the binary verifiable reward (RLVR), and engines/grading.py, the worker pool
its symbolic check runs under (section 5).

Run: python -m pytest -q tests/test_verify.py    (~140 cases, ~15 s; the adversarial cases wait out 1 s
timeouts, and two tests start a verify worker process, ~1-3 s each)

Each rule is tested from both sides: a pair it must accept and a pair it must reject. The `check`
column says which stage must decide, so a test fails if, say, sympy starts answering what the
cheap numeric path should. No assert reads a clock as an upper bound: speed is checked as work
(steps and characters counted), and hangs by a generous hang guard, so a busy CI machine cannot
fail a test that an idle one passes.
"""
import json
import operator
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import verify
from engines import grading
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
    ("The answer is 18. So the total is 20.", False, ("18", "answer_is")),  # answer_is outranks final_sentence
    ("So 3 + 4 is 7.", True, ("7", "last_number")),  # two numbers: not a final statement, the flag still finds 7
])
def test_extract_answer(completion, fallback, expected):
    assert extract_answer(completion, last_number_fallback=fallback) == expected


# The final-sentence rule (issue 16, item 10): the closing sentence states exactly one number with a
# copula (is/are/was/were/be/equals/=), followed by at most three unit words and a full stop.
@pytest.mark.parametrize("completion, expected", [
    ("So the total is 200 dollars.", "200"),  # the example: no box, no ####, no "answer is"
    ("Natalia sold 48 + 24 = 72 clips.\nSo the total is 200 dollars.", "200"),  # earlier sentences may hold numbers
    ("Therefore, the amount she spent is $1,200.", "1,200"),
    ("She earned 0.2 * 50 = 10. So, her earnings are **$10**.", "10"),  # markdown bold and a dollar sign
    ("She has 12 eggs left, so the number sold is 9.", "9"),  # ", so" opens the concluding clause
    ("x = -5.", "-5"),
    ("Her speed was 12.5 miles per hour!", "12.5"),
    ("The probability is 50%.", "50%"),
])
def test_final_sentence_accepts_a_closing_statement(completion, expected):
    assert extract_answer(completion) == (expected, "final_sentence")


@pytest.mark.parametrize("completion", [
    "So 3 + 4 is 7.",  # two numbers: an intermediate step, not a result
    "x is 5 when y is 3.",  # two numbers: a condition
    "Is the total 200 dollars?",  # a question
    "First, 3 * 4 = 12. Then we add 5",  # the derivation goes on: the last sentence states nothing
    "So the total is 200",  # unfinished (truncated?) sentence: no full stop
    "The total is 200 dollars.\nLet me double-check this.",  # not the final sentence
    "The total is 200 dollars more than last year.",  # a relation, not a value
    "The total is 5 times the cost.",
    "If each apple is 2 dollars.",  # a condition
    "The total is not 200.",  # a negation
    "It is about 200 dollars.",  # an estimate
    "The cost is 5x.",  # '5x' is no number followed by a unit
    "In 2023 the total is 200 dollars.",  # two numbers
    "The total is 1/2 of 40.",
    "x" * 400 + " so the total is 200.",  # a 'sentence' longer than _FINAL_SENTENCE_CHARS = 300
])
def test_final_sentence_rejects_what_is_not_a_closing_statement(completion):
    assert extract_answer(completion) == (None, "none")


def test_final_sentence_reward_both_ways_and_its_switch():
    text = "Each shirt costs 25 dollars and he buys 8.\nSo the total is 200 dollars."
    assert reward(text, "200") == 1.0  # exact: 0/1 rewards
    assert reward(text, "300") == 0.0  # exact: 0/1 rewards; the rule extracts; equality still decides
    assert reward(text, "200", final_sentence=False) == 0.0  # exact: 0/1 rewards; off: nothing extracted, as before
    assert reward(text, "8", last_number_fallback=True) == 0.0  # exact: 0/1 rewards; it outranks the last-number rule (200, not 8)


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
    ("1.3e-3", r"1.3 \times 10^{-3}", "numeric"),  # scientific notation (Minerva's physics answers)
    (r"4.5 \times 10^{33}", "4.5E33", "numeric"),
    (r"1.3\cdot10^{-3}\text{ m}", "0.0013", "numeric"),
    (r"10^{5}", "100000", "numeric"),
    ("2*10^5", "2e+5", "numeric"),
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
    (r"2 \times 10^{-3}", r"3 \times 10^{-3}", "numeric"),
    ("1.3e-3", "0.0014", "numeric"),  # exact: no tolerance for rounding
    ("1e999", "1", "numeric"),  # a 3-digit exponent is still exact (a 4-digit one goes to sympy)
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
    assert reward("17", "17", last_number_fallback=True) == 1.0  # exact: 0/1 rewards
    assert reward("-5", "-5", last_number_fallback=True) == 1.0  # exact: 0/1 rewards
    assert reward("-5", "5", last_number_fallback=True) == 0.0  # exact: 0/1 rewards
    assert reward(" 17\n", "17", last_number_fallback=True) == 1.0  # exact: 0/1 rewards
    assert reward("17", "17") == 0.0  # exact: 0/1 rewards; without the flag nothing is extracted


def test_toy_path_never_reaches_sympy():
    stats = VerifyStats()
    scores = rewards([str(i % 40 - 20) for i in range(2000)], ["17"] * 2000, last_number_fallback=True, stats=stats)
    assert sum(scores) == 2000 / 40  # exact: a sum of 0/1 rewards: integer-valued; i % 40 - 20 == 17 once per 40 (i % 40 == 37)
    assert set(stats.by_check) == {"exact", "numeric"}  # no "symbolic": math-verify never called (~50 us a call)


def test_empty_and_missing_answers_score_zero_and_are_counted():
    stats = VerifyStats()
    assert reward("", "17", stats=stats) == 0.0  # exact: 0/1 rewards
    assert reward("I have no idea.", "17", last_number_fallback=True, stats=stats) == 0.0  # exact: 0/1 rewards
    assert reward(None, "17", stats=stats) == 0.0  # exact: 0/1 rewards; model output that is not even a string
    assert (stats.checked, stats.correct, stats.by_check) == (3, 0, {"no_answer": 3})
    assert stats.by_rule == {"none": 3}


def test_reference_may_be_an_int_but_not_none():
    assert reward(r"\boxed{17}", 17) == 1.0  # exact: 0/1 rewards
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
    assert out == [1.0, 1.0, 0.0, 1.0]  # exact: 0/1 rewards
    assert stats.by_rule == {"boxed": 1, "gsm8k": 1, "answer_is": 1, "last_number": 1}
    assert stats.as_dict()["correct"] == 3 and stats.timeouts == 0 and stats.errors == 0


# ---------------------------------------------------------------------------------------------
# 5. Adversarial input: size caps and the hard timeout
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("garbage", [
    "x" * 100_000,
    "1" * 100_000,  # one 32,000-digit "last number": over the answer cap, never parsed
    ("{\\frac{" * 8 + "}" * 5 + "#### ( \\boxed{" + "$" * 3) * 2_500,  # ~100 kB of broken LaTeX
    "\\boxed{" * 15_000,  # 105 kB of unclosed boxes: 12 s before extraction was linear (issue 16)
])
def test_100kb_garbage_scores_zero(garbage):
    assert len(garbage) >= 100_000
    stats = VerifyStats()
    assert reward(garbage, "1", last_number_fallback=True, stats=stats, timeout_s=1.0) == 0.0  # exact: 0/1 rewards
    assert stats.errors == 0 and stats.timeouts == 0  # extraction needs no timeout: see the next test


# Extraction work, counted rather than timed: lines of verify.py that run (sys.settrace) plus the
# characters its regular expressions read (a search up to its match or the end, a finditer the
# whole range). Input 4,000 -> 8,000 characters must at most double the work. The first version
# matched each unclosed `\boxed{` to the end of the text on its own: ~4 million steps at 4 kB.
def _extraction_work(text: str) -> int:
    steps, read, target = [0], [0], verify.__file__

    def local(frame, event, arg):
        steps[0] += event == "line"
        return local

    class Counted:  # a compiled pattern that adds the characters each call reads
        def __init__(self, pattern):
            self.pattern = pattern

        def __getattr__(self, name):
            method = getattr(self.pattern, name)
            if name not in ("search", "match", "fullmatch", "finditer", "findall"):
                return method

            def counted(string, pos=0, endpos=sys.maxsize):
                result = method(string, pos, endpos)
                stop = min(endpos, len(string))
                if name in ("search", "match"):  # reads up to the end of its match; a failed match ~1
                    stop = result.end() if result else (stop if name == "search" else pos + 1)
                read[0] += max(stop - pos, 0)
                return result
            return counted

    patterns = {k: v for k, v in vars(verify).items() if isinstance(v, re.Pattern)}
    old_trace = sys.gettrace()
    try:
        for name, pattern in patterns.items():
            setattr(verify, name, Counted(pattern))
        sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename == target else None)
        extract_answer(text, last_number_fallback=True)
    finally:
        sys.settrace(old_trace)
        for name, pattern in patterns.items():
            setattr(verify, name, pattern)
    return steps[0] + read[0]


@pytest.mark.parametrize("make", [
    lambda n: ("\\boxed{" * n)[:n],  # unclosed boxes (the 12 s case at 32 kB)
    lambda n: ("{\\frac{" * 8 + "}" * 5 + "#### ( \\boxed{" + "$" * 3) * (n // 40),  # broken LaTeX
    lambda n: "\\boxed{" * (n // 8) + "5" + "}" * (n // 8),  # boxes nested n/8 deep
    lambda n: "\\boxed" * (n // 6) + "5",  # `\boxed 5` nested n/6 deep
    lambda n: ("\\boxed" + " " * 20 + "{") * (n // 27),  # spaces between box and brace
    lambda n: ("the answer is " * n)[:n],
    lambda n: ("answer is. " * n)[:n],  # every phrase empty: each one is passed over
    lambda n: ("So the total is 200 dollars. " * n)[:n],
], ids=["unclosed", "garbage", "nested", "nested-bare", "spaces", "answer-is", "empty-answer-is", "final"])
def test_extraction_work_is_linear_in_the_input(make):
    small, large = _extraction_work(make(4_000)), _extraction_work(make(8_000))
    assert large <= 2.1 * small + 100  # linear: twice the text, at most twice the work
    assert small <= 10 * 4_000  # and a small constant per character (measured: at most ~5)


def test_deeply_nested_latex_times_out():
    stats = VerifyStats()
    assert reward(rf"\boxed{{{NESTED_FRACS}}}", "1", timeout_s=1.0, stats=stats) == 0.0  # exact: 0/1 rewards
    assert stats.timeouts == 1 and stats.by_check == {"timeout": 1}  # the guard fired, nothing raised


# A reward call from a worker thread on `9^{9^{9^9}}`: sympy's integer power is one C call that never
# returns. The first version ran the check in a thread and raised an exception into it, which a C call
# never sees; the thread held the GIL and the caller hung with it (over 120 s, issue 16). The check now
# runs in engines/grading.py's worker process. Run in a
# fresh interpreter, so that a regression hangs that interpreter (killed after 120 s), not pytest.
TOWER_FROM_A_THREAD = r"""
import json, threading, verify
from engines import grading
stats, out = verify.VerifyStats(), {}

def score():
    out["tower"] = verify.reward(r"\boxed{9^{9^{9^9}}}", "1", timeout_s=1.0, stats=stats)
    out["live_workers"] = sum(w.alive() for w in grading._live_workers)  # the one that ran it was killed
    out["after"] = verify.reward(r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt2}{2}", stats=stats)  # a new worker

caller = threading.Thread(target=score, daemon=True)
caller.start()
caller.join(60)  # hang guard only: it returns after ~1 s plus two worker start-ups
out["returned"] = not caller.is_alive()
out["by_check"] = stats.by_check
print(json.dumps(out))
"""


def test_timeout_off_the_main_thread_stops_a_c_call():
    run = subprocess.run([sys.executable, "-c", TOWER_FROM_A_THREAD], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["returned"] and out["tower"] == 0.0  # exact: 0/1 rewards
    assert out["by_check"] == {"timeout": 1, "symbolic": 1}  # recorded as a timeout, not an error
    assert out["live_workers"] == 0
    assert out["after"] == 1.0  # exact: 0/1 rewards; the next check runs in a fresh worker


def test_worker_process_returns_values_and_exceptions():
    """Off the main thread fn runs in the worker process: results and exceptions come back by pickle,
    and a lambda (which does not pickle) is a one-line TypeError rather than a hang."""
    out = {}

    def calls():
        out["sum"] = grading.run_with_timeout(operator.add, 5.0, 2, 3)
        for key, fn, args in [("zero", operator.truediv, (1, 0)), ("lambda", lambda: 1, ())]:
            try:
                grading.run_with_timeout(fn, 5.0, *args)
            except Exception as e:  # noqa: BLE001
                out[key] = type(e).__name__, str(e)

    caller = threading.Thread(target=calls)
    caller.start()
    caller.join(120)  # hang guard: one worker start-up (~1-3 s) and three round trips
    assert out["sum"] == 5
    assert out["zero"][0] == "ZeroDivisionError"
    assert out["lambda"][0] == "TypeError" and "module-level function" in out["lambda"][1]
    assert verify.is_equivalent(r"\sqrt{2}/2", r"\frac{\sqrt2}{2}") == (True, "symbolic")  # main thread: alarm


def test_timeout_guard_restores_signal_state():
    def spin():
        while True:
            pass

    sentinel = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGALRM, sentinel)
    try:
        t0 = time.perf_counter()
        with pytest.raises(grading._CheckTimeout):
            grading.run_with_timeout(spin, 0.2)  # spin never returns: the alarm stopped it
        assert time.perf_counter() - t0 >= 0.2  # and not early (a lower bound: a busy machine only adds)
        assert signal.getsignal(signal.SIGALRM) is sentinel  # our handler is gone again
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # exact: a disarmed timer reads 0; no stray alarm left armed
        assert grading.run_with_timeout(lambda: 6 * 7, 0.2) == 42
        with pytest.raises(ZeroDivisionError):  # ordinary exceptions pass through; is_equivalent counts them
            grading.run_with_timeout(lambda: 1 / 0, 0.2)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_timeout_guard_keeps_an_outer_timer():
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # e.g. pytest-timeout's alarm
        grading.run_with_timeout(lambda: None, 0.5)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------
# 6. Format reward (flag, default off)
# ---------------------------------------------------------------------------------------------
def test_format_reward_is_off_by_default():
    assert reward(r"so \boxed{4}", "4") == 1.0  # exact: 0/1 rewards; exactly binary: no bonus hiding in the default


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
