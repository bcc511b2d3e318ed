"""The verifiable reward of RLVR: a completion and a reference answer in, a reward R in {0, 1} out.

RLVR (RL with verifiable rewards, as in DeepSeekMath's GRPO and DeepSeek-R1) scores a rollout by
checking its final answer against the reference, with no learned reward model. CoBA-RL assumes
exactly this binary reward (method.md §0, paper §2.1): a prompt's pass rate p_i (eq. 1) is the mean
of these rewards over its rollouts, and F_t (eq. 4) is built from them.

Test:   python -m pytest -q tests/test_verify.py          (~100 cases, ~6 s)
Teach:  python verify.py "so the answer is \\boxed{\\frac{1}{2}}" "0.5"   (prints answer, rule, reward)

Pipeline, cheapest first (the toy task's bare integers never leave step 2):
  1. extract_answer: the last \\boxed{...} (nested braces, \\fbox, `\\boxed 5`) > GSM8K `#### 42` >
     "the answer is X" > (flag) the last number in the text. None when nothing matches.
  2. exact and numeric equality after a string normalization (ours, see `normalize`).
  3. symbolic equality with math-verify (`math_verify.parse` / `math_verify.verify`): LaTeX
     expressions, sets, intervals, matrices. Only when step 2 cannot decide.
Every check runs under a hard timeout (sympy can hang on adversarial input) and a size cap; a
timeout or an exception scores 0 and is counted in `VerifyStats`, never raised.

Which part is ours and which is math-verify's:
  - ours: answer extraction (math-verify's extraction takes the first/any match and knows no
    `####` or last-number rule), the string normalization and the exact/numeric fast path (no
    sympy, thousands of calls per second), the timeout guard, the size caps, the statistics, the
    format bonus and the CLI.
  - math-verify's: everything symbolic (LaTeX -> sympy, set/interval/matrix/equation comparison).

The timeout. math-verify 0.9.0 has its own (`parse(parsing_timeout=5)`, `verify(timeout_seconds=5)`),
but it uses signal.alarm, which takes whole seconds, restarts for every parse and every comparison
rather than bounding the check, and raises a ValueError off the main thread. So we pass None to
both (timeouts off) and guard the whole check (parse gold + parse prediction + compare) ourselves:
  - on the main thread: signal.setitimer (float seconds, same SIGALRM mechanism as math-verify),
    re-firing every 50 ms in case some library code swallows the first interrupt;
  - off the main thread (or without SIGALRM, e.g. Windows): the check runs in a daemon worker
    thread; the caller waits `timeout_s`, then returns 0 and asks CPython to raise an exception in
    the worker (PyThreadState_SetAsyncExc), which stops it at its next bytecode.
Both interrupt Python code only: a single C call (say a giant integer power) is not interruptible,
which is one reason for the size cap. No process is spawned per call.

Departures and choices (ours): numbers are compared exactly (0.333 != 1/3; math-verify would round
to 6 digits, but two plain numbers never reach it); a percentage matches both its value and its
value / 100 ("50%" = "50" = "0.5"); the last *complete* box wins (a truncated `\\boxed{12` is
skipped); "the answer is 18 dollars" gives "18". The format bonus is added on top of the 0/1 reward
(DeepSeek-R1 style), so with it on the reward is no longer binary: keep it off (the default) when
the rewards feed CoBA's pass rates.
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0  # per symbolic check; a sane sympy check takes < 0.3 s, math-verify's default is 5 s
MAX_COMPLETION_CHARS = 32_000  # ~8k tokens, twice the paper's 4096-token responses; we keep the tail
MAX_ANSWER_CHARS = 1_000  # longer extracted answers / references never reach sympy


# ---------------------------------------------------------------------------------------------
# Statistics: what the trainer logs per step (verify_timeouts, verify_errors)
# ---------------------------------------------------------------------------------------------
@dataclass
class VerifyStats:
    """Counters over reward() calls. `by_rule`: which extraction rule fired; `by_check`: what decided."""

    checked: int = 0
    correct: int = 0
    timeouts: int = 0
    errors: int = 0
    oversize: int = 0  # answers or references over MAX_ANSWER_CHARS: scored 0 without parsing
    by_rule: dict = field(default_factory=dict)
    by_check: dict = field(default_factory=dict)

    def count(self, rule: str, check: str, correct: bool) -> None:
        self.checked += 1
        self.correct += int(correct)
        self.timeouts += check == "timeout"
        self.errors += check == "error"
        self.oversize += check == "oversize"
        self.by_rule[rule] = self.by_rule.get(rule, 0) + 1
        self.by_check[check] = self.by_check.get(check, 0) + 1

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# 1. Extraction of the final answer (ours)
# ---------------------------------------------------------------------------------------------
_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b\s*:?|:)\s*", re.IGNORECASE)
_BARE_ARG = re.compile(r"[^\s${}]+")
_NUMBER_THEN_WORDS = re.compile(r"\$?([-\u2212]?\d[\d,]*(?:\.\d+)?)\$?\s+[A-Za-z]")
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
# A number; its minus sign counts only where it cannot be a binary minus ("3-5" ends in 5, "x=-5" in -5).
_NUMBER = re.compile(r"(?:(?<![\w)\]}.])[-\u2212])?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def _box_content(text: str, start: int) -> tuple[str | None, int]:
    """Argument of the \\boxed that ends at `start`: balanced {...} (escaped \\{ \\} skipped) or,
    for `\\boxed 5`, the next run of non-space characters. (None, start) if unclosed or empty."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        depth, j = 0, i
        while j < len(text):
            c = text[j]
            if c == "\\":
                j += 2  # \{ and \} are literal braces of the answer, not grouping
                continue
            depth += (c == "{") - (c == "}")
            if depth == 0:
                content = text[i + 1 : j].strip()
                return (content or None), j + 1
            j += 1
        return None, start  # truncated completion: this box never closes
    m = _BARE_ARG.match(text, i)  # `\boxed 5`, `\boxed5`
    return (m.group(0) if m else None), (m.end() if m else start)


def _boxes(text: str) -> list[tuple[str, int, int]]:
    """Top-level complete boxes as (content, start, end); boxes inside a box are part of its content."""
    found, i = [], 0
    while (m := _BOX.search(text, i)) is not None:
        content, end = _box_content(text, m.end())
        if content is None:
            i = m.end()
        else:
            found.append((content, m.start(), end))
            i = end
    return found


def _answer_is(text: str) -> str | None:
    """The phrase after the last 'answer is' / 'answer:', cut at the end of its line or sentence."""
    tails = [text[m.end() :].split("\n", 1)[0] for m in _ANSWER_IS.finditer(text)]
    for tail in reversed(tails):
        end = _SENTENCE_END.search(tail)
        phrase = (tail[: end.start()] if end else tail).strip(" \t*")  # '*': markdown bold
        if (m := _NUMBER_THEN_WORDS.match(phrase)) is not None:
            return m.group(1)  # "18 dollars a week" -> "18"
        if phrase:
            return phrase
    return None


def extract_answer(completion: str, last_number_fallback: bool = False) -> tuple[str | None, str]:
    """Final answer of a completion and the rule that found it: "boxed", "gsm8k", "answer_is",
    "last_number" (only with the flag) or "none" (answer None). Never raises on a string."""
    text = completion[-MAX_COMPLETION_CHARS:] if isinstance(completion, str) else ""
    if "box" in text:  # cheap test before the scan
        boxes = _boxes(text)
        if boxes:
            return _unwrap_box(boxes[-1][0]), "boxed"  # several boxes: the last one wins
    if "####" in text:
        found = _GSM8K.findall(text)
        if found and found[-1].strip():
            return found[-1].strip(), "gsm8k"
    phrase = _answer_is(text)
    if phrase is not None:
        return phrase, "answer_is"
    if last_number_fallback:
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1], "last_number"
    return None, "none"


def is_well_formed(completion: str) -> bool:
    """Format check for the optional bonus: exactly one \\boxed{} and nothing after it but closing
    math delimiters, a full stop or spaces."""
    text = completion[-MAX_COMPLETION_CHARS:] if isinstance(completion, str) else ""
    boxes = _boxes(text)
    if len(boxes) != 1 or len(_BOX.findall(boxes[0][0])) > 0:
        return False
    return re.fullmatch(r"[\s$.\\\])]*", text[boxes[0][2] :]) is not None


# ---------------------------------------------------------------------------------------------
# 2. Normalization and the exact / numeric fast path (ours: no sympy involved)
# ---------------------------------------------------------------------------------------------
_UNITS = (
    "cm|mm|km|m|kg|g|mg|s|sec|seconds?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|"
    "dollars?|cents?|euros?|degrees?|units?|inch(?:es)?|feet|foot|ft|meters?|miles?|mph|"
    "square units|sq units|cups?|pounds?|lbs?|ounces?|oz|liters?|litres?|ml|l|people|students|items"
)
_UNIT_SUFFIX = re.compile(rf"(?<=[\d}}])\s*(?:{_UNITS})(?:\^?\{{?[23]\}}?)?\.?\s*$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?")
_SIGNED = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(rf"({_SIGNED})(%?)")
_SLASH = re.compile(rf"({_SIGNED})/({_SIGNED})")
_FRAC = re.compile(r"([+-]?)\\frac(?:\{(\d+(?:\.\d+)?)\}\{(\d+(?:\.\d+)?)\}|(\d)(\d))")


def _unwrap_box(s: str) -> str:
    """'\\boxed{5}' -> '5' (a reference may come boxed, a box may sit inside a box)."""
    while True:
        boxes = _boxes(s)
        if len(boxes) != 1 or boxes[0][1] != 0 or s[boxes[0][2] :].strip():
            return s
        s = boxes[0][0]


def normalize(s: str) -> str:
    """String normal form for the exact check: no `$`, \\text{}, units, thousands separators,
    trailing .0, spaces, \\left/\\right; \\dfrac -> \\frac. Example: '$1{,}000\\text{ cm}$' -> '1000'."""
    s = _unwrap_box(s.strip())
    s = s.replace("\\$", "").replace("$", "").replace("\u2212", "-")
    s = _TEXT_CMD.sub(r"\1", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)  # the lookahead keeps \rightarrow
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s).replace("\\displaystyle", "")
    s = re.sub(r"\^\s*\{?\\circ\}?|\u00b0", "", s).replace("\\%", "%").replace("{,}", ",")
    s = re.sub(r"(?<!\\)\\[,;:! ]|~", " ", s)  # LaTeX spacing commands, not the `\\` of a matrix row
    s = _UNIT_SUFFIX.sub("", s.strip())
    s = re.sub(r"\s+", "", s).rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return re.sub(r"^([+-]?\d+)\.0+(%?)$", r"\1\2", s)


def _as_numbers(s: str) -> set[Fraction] | None:
    """Exact value(s) of a normalized plain number: int, decimal, a/b, \\frac{a}{b}, x% (-> {x, x/100},
    since 'what percent' questions are answered both ways). None if `s` is not one of these."""
    if m := _PLAIN.fullmatch(s):
        x = Fraction(m.group(1))
        return {x, x / 100} if m.group(2) else {x}
    if (m := _SLASH.fullmatch(s)) and Fraction(m.group(2)) != 0:
        return {Fraction(m.group(1)) / Fraction(m.group(2))}
    if m := _FRAC.fullmatch(s):
        num, den = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
        if Fraction(den) != 0:
            return {(-1 if m.group(1) == "-" else 1) * Fraction(num) / Fraction(den)}
    return None


# ---------------------------------------------------------------------------------------------
# 3. Symbolic equality (math-verify) under a hard timeout (the guard is ours)
# ---------------------------------------------------------------------------------------------
class _CheckTimeout(BaseException):
    """Raised into a running check. A BaseException, so the `except Exception` blocks inside
    math-verify and sympy cannot swallow it."""


def _with_alarm(fn, timeout_s: float):
    """Main thread: SIGALRM after timeout_s, then every 50 ms until disarmed. Restores the previous
    handler and any outer timer (pytest-timeout, for one) with what is left of it."""
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:  # a late alarm after fn() returned must not hit the caller's code
            raise _CheckTimeout()

    t0 = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer_left, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.05)
    try:
        return fn()
    finally:
        while armed[0]:
            try:
                armed[0] = False  # once this store ran, on_alarm is a no-op
            except _CheckTimeout:  # an alarm landed just before the store: fn() is finished anyway
                pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
        if outer_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - t0), 1e-3))


def _in_worker_thread(fn, timeout_s: float):
    """Any thread: run fn in a daemon thread, give up after timeout_s and stop the worker with an
    asynchronous exception (CPython C API; takes effect at the worker's next bytecode)."""
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except _CheckTimeout:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which counts it
            box["error"] = e

    worker = threading.Thread(target=work, name="verify-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_CheckTimeout))
        raise _CheckTimeout()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_with_timeout(fn, timeout_s: float):
    """fn() or _CheckTimeout after timeout_s seconds, from any thread."""
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _with_alarm(fn, timeout_s)
    return _in_worker_thread(fn, timeout_s)


class _DropTimeoutDisabledWarning(logging.Filter):
    def filter(self, record):  # we pass timeout=None on purpose: our guard above does the timing
        return not record.getMessage().startswith("Timeout is disabled")


_math_verify = None


def _load_math_verify():
    """Imported on first use (0.6 s, sympy), outside any timeout, so the toy's integers never pay it."""
    global _math_verify
    if _math_verify is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _math_verify = math_verify
    return _math_verify


def _symbolic_equal(pred: str, ref: str) -> bool:
    """math-verify on the raw strings (it has its own LaTeX normalization; ours drops spaces, which
    would turn '\\pi r' into '\\pir'). Gold first: math-verify's verify is not symmetric."""
    mv = _math_verify
    wrap = lambda s: s if "$" in s or "\\boxed" in s else f"${s}$"  # noqa: E731 - its extractor wants math mode
    gold = mv.parse(wrap(ref), parsing_timeout=None)
    target = mv.parse(wrap(pred), parsing_timeout=None)
    if not gold or not target:
        return False
    return bool(mv.verify(gold, target, timeout_seconds=None, raise_on_error=True))


def is_equivalent(pred: str, ref: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """Is the prediction the reference? Returns (equal, check) with check in "exact", "numeric",
    "symbolic", "oversize", "timeout", "error". Never raises."""
    try:
        if len(pred) > MAX_ANSWER_CHARS or len(ref) > MAX_ANSWER_CHARS:
            return False, "oversize"  # before any parsing: int() of 30k digits alone raises
        p, r = normalize(pred), normalize(ref)
        if p == r and p:
            return True, "exact"
        p_num, r_num = _as_numbers(p), _as_numbers(r)
        if p_num is not None and r_num is not None:
            return bool(p_num & r_num), "numeric"  # two plain numbers: decided without sympy
        _load_math_verify()
        pred_raw, ref_raw = _unwrap_box(pred.strip()), _unwrap_box(ref.strip())
        return run_with_timeout(lambda: _symbolic_equal(pred_raw, ref_raw), timeout_s), "symbolic"
    except _CheckTimeout:
        logger.debug("verify timeout after %.1f s on %.80r", timeout_s, pred)
        return False, "timeout"
    except Exception:  # noqa: BLE001 - model output must never crash training
        logger.debug("verify error on %.80r", pred, exc_info=True)
        return False, "error"


# ---------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------
@dataclass
class Grade:
    """Everything reward() decided, for the CLI and for debugging."""

    answer: str | None  # extracted final answer
    rule: str  # extraction rule
    check: str  # what decided equality ("no_answer" when nothing was extracted)
    correct: bool
    reward: float


def grade(completion: str, answer: str, *, last_number_fallback: bool = False, format_reward: float = 0.0,
          timeout_s: float = DEFAULT_TIMEOUT_S, stats: VerifyStats | None = None) -> Grade:
    """reward() with its reasons. `answer` is ours (the data set's), so a bad one is a ValueError;
    `completion` is the model's, so nothing in it raises."""
    if isinstance(answer, (int, Fraction)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str):
        raise ValueError(f"reference answer must be a str, got {type(answer).__name__}: "
                         "fix the data set's answer field")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}: pass e.g. timeout_s={DEFAULT_TIMEOUT_S}")
    if not isinstance(completion, str):
        completion = ""
    try:
        pred, rule = extract_answer(completion, last_number_fallback)
    except Exception:  # noqa: BLE001 - defensive: extraction is plain string code
        pred, rule = None, "none"
    correct, check = (False, "no_answer") if pred is None else is_equivalent(pred, answer, timeout_s)
    bonus = format_reward if format_reward and is_well_formed(completion) else 0.0
    if stats is not None:
        stats.count(rule, check, correct)
    return Grade(pred, rule, check, correct, float(correct) + bonus)


def reward(completion: str, answer: str, *, last_number_fallback: bool = False, format_reward: float = 0.0,
           timeout_s: float = DEFAULT_TIMEOUT_S, stats: VerifyStats | None = None) -> float:
    """1.0 if the completion's final answer equals `answer`, else 0.0 (plus `format_reward` for a
    well-formed completion when that flag is > 0). Timeouts and errors score 0 and go to `stats`."""
    return grade(completion, answer, last_number_fallback=last_number_fallback, format_reward=format_reward,
                 timeout_s=timeout_s, stats=stats).reward


def rewards(completions: list[str], answers: list[str], **kwargs) -> list[float]:
    """reward() over a batch, one answer per completion (the trainer repeats a prompt's answer B_i times)."""
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers: pass one answer per completion")
    return [reward(c, a, **kwargs) for c, a in zip(completions, answers)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Score one completion against a reference answer.")
    parser.add_argument("completion", help="model output, e.g. 'so x = \\boxed{\\frac{1}{2}}'")
    parser.add_argument("answer", help="reference answer, e.g. '0.5'")
    parser.add_argument("--last-number-fallback", action="store_true",
                        help="use the last number if no other rule matches")
    parser.add_argument("--format-reward", type=float, default=0.0,
                        help="bonus for exactly one final \\boxed{} (default 0: off)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per symbolic check")
    args = parser.parse_args(argv)
    g = grade(args.completion, args.answer, last_number_fallback=args.last_number_fallback,
              format_reward=args.format_reward, timeout_s=args.timeout)
    print(f"extracted: {g.answer!r}\nrule:      {g.rule}\ncheck:     {g.check}\nreward:    {g.reward}")


if __name__ == "__main__":
    main()
