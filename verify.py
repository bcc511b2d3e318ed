"""The verifiable reward of RLVR (paper §2.1): a completion and a reference answer in, R in {0, 1} out.

R = 1 if the completion's final answer equals the reference, else 0: a verifier, no learned reward
model (as in DeepSeekMath's GRPO and DeepSeek-R1). CoBA-RL assumes exactly this reward: a prompt's
pass rate p_i (eq. 1) is the mean of these rewards over its rollouts, and F_t (eq. 4) is built from them.

Test:   python -m pytest -q tests/test_verify.py          (~140 cases, ~15 s)
Teach:  python verify.py "so the answer is \\boxed{\\frac{1}{2}}" "0.5"   (prints answer, rule, reward)

The file reads top to bottom: `reward` / `rewards` / `grade`, then the pipeline behind them.
Pipeline, cheapest first (the toy task's bare integers never leave step 2):
  1. extract_answer: the last \\boxed{...} (nested braces, \\fbox, `\\boxed 5`) > GSM8K `#### 42` >
     "the answer is X" > a final sentence stating one number ("So the total is 200 dollars.") >
     (flag) the last number in the text. None when nothing matches. Linear time in the text.
  2. exact and numeric equality after a string normalization (ours, see `normalize`).
  3. symbolic equality with math-verify (`math_verify.parse` / `math_verify.verify`): LaTeX
     expressions, sets, intervals, matrices. Only when step 2 cannot decide.
Every symbolic check runs under a hard timeout (sympy can hang on adversarial input; the guard and
its worker process are engines/grading.py) and a size cap; a timeout or an exception scores 0 and
is counted in `VerifyStats`, never raised. Extraction and the fast path need no timeout: they are
linear in the (capped) length of the text. Which parts are ours and which math-verify's, and where
we depart from it: docs/method-sources.md §0.
"""
from __future__ import annotations

import argparse
import logging
import re
from dataclasses import asdict, dataclass, field
from fractions import Fraction

from engines.grading import _CheckTimeout, _load_math_verify, run_with_timeout

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0  # per symbolic check; a sane sympy check takes < 0.3 s, math-verify's default is 5 s
MAX_COMPLETION_CHARS = 32_000  # ~8k tokens, twice the paper's 4096-token responses; we keep the tail
MAX_ANSWER_CHARS = 1_000  # longer extracted answers / references never reach sympy


# ---------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------
def reward(completion: str, answer: str, *, last_number_fallback: bool = False, final_sentence: bool = True,
           format_reward: float = 0.0, timeout_s: float = DEFAULT_TIMEOUT_S,
           stats: VerifyStats | None = None) -> float:
    """1.0 if the completion's final answer equals `answer`, else 0.0 (plus `format_reward` for a
    well-formed completion when that flag is > 0). Timeouts and errors score 0 and go to `stats`."""
    return grade(completion, answer, last_number_fallback=last_number_fallback, final_sentence=final_sentence,
                 format_reward=format_reward, timeout_s=timeout_s, stats=stats).reward


def rewards(completions: list[str], answers: list[str], **kwargs) -> list[float]:
    """reward() over a batch, one answer per completion (the trainer repeats a prompt's answer B_i times)."""
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers: pass one answer per completion")
    return [reward(c, a, **kwargs) for c, a in zip(completions, answers)]


def grade(completion: str, answer: str, *, last_number_fallback: bool = False, final_sentence: bool = True,
          format_reward: float = 0.0, timeout_s: float = DEFAULT_TIMEOUT_S,
          stats: VerifyStats | None = None) -> Grade:
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
        pred, rule = extract_answer(completion, last_number_fallback, final_sentence)
    except Exception:  # noqa: BLE001 - defensive: extraction is plain string code
        pred, rule = None, "none"
    correct, check = (False, "no_answer") if pred is None else is_equivalent(pred, answer, timeout_s)
    bonus = format_reward if format_reward and is_well_formed(completion) else 0.0
    if stats is not None:
        stats.count(rule, check, correct)
    return Grade(pred, rule, check, correct, float(correct) + bonus)


@dataclass
class Grade:
    """Everything reward() decided, for the CLI and for debugging."""

    answer: str | None  # extracted final answer
    rule: str  # extraction rule
    check: str  # what decided equality ("no_answer" when nothing was extracted)
    correct: bool
    reward: float


# What the trainer logs per step (verify_timeouts, verify_errors)
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
_PHRASE_END = re.compile(r"\.(?:\s|$)|\n")  # a full stop before a space or the end, or the line's end
_BARE_ARG = re.compile(r"[^\s${}]+")
_SPACES = re.compile(r"[ \t]*")
_LEADING_WS = re.compile(r"\s*")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # `\x` first, so `\{` and `\}` are never braces
_NUMBER_THEN_WORDS = re.compile(r"\$?([-\u2212]?\d[\d,]*(?:\.\d+)?)\$?\s+[A-Za-z]")
# A number; its minus sign counts only where it cannot be a binary minus ("3-5" ends in 5, "x=-5" in -5).
_NUMBER = re.compile(r"(?:(?<![\w)\]}.])[-\u2212])?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")

# Linear time. Every scan below is one left-to-right pass, or a pass over a region no other pass
# reads, so extraction costs O(len(text)) whatever the text. Matching each `\boxed{` to its closing
# brace on its own would not be: 4,500 unclosed boxes in 32 kB would mean 4,500 scans of up to
# 32 kB each, 12 s outside any timeout. tests/test_verify.py counts the steps.


def _brace_pairs(text: str) -> dict[int, int]:
    """Position of each '{' -> position of its matching '}', from one pass with a stack. Unclosed
    braces are left out; `\\{` and `\\}` are literal braces of the answer, not grouping. Scanning
    from 0 gives a box's brace the same partner as scanning from the box itself: the character
    before a box's '{' is a letter or a space, never a backslash that would swallow it."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif m.group() == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _box_span(text: str, start: int, pairs: dict[int, int]) -> tuple[int, int, int] | None:
    """Argument of the \\boxed that ends at `start`, as (lo, hi, end): the content text[lo:hi]
    without surrounding whitespace, `end` just past the box. Balanced {...} (looked up in `pairs`)
    or, for `\\boxed 5`, the next run of non-space characters. None if unclosed or empty."""
    i = _SPACES.match(text, start).end()
    if i < len(text) and text[i] == "{":
        j = pairs.get(i)
        if j is None:
            return None  # truncated completion: this box never closes
        lo, hi = _LEADING_WS.match(text, i + 1, j).end(), j
        while hi > lo and text[hi - 1].isspace():  # str.strip(), without copying the content
            hi -= 1
        return (lo, hi, j + 1) if hi > lo else None
    m = _BARE_ARG.match(text, i)  # `\boxed 5`, `\boxed5`
    return (i, m.end(), m.end()) if m else None


def _boxes(text: str) -> list[tuple[str, int, int]]:
    """Top-level complete boxes as (content, start, end); boxes inside a box are part of its content."""
    pairs = _brace_pairs(text)
    found, i = [], 0
    while (m := _BOX.search(text, i)) is not None:
        span = _box_span(text, m.end(), pairs)
        if span is None:
            i = m.end()
        else:
            found.append((text[span[0] : span[1]], m.start(), span[2]))
            i = span[2]  # skip the content: its boxes belong to this one
    return found


def _answer_is(text: str) -> str | None:
    """The phrase after the last 'answer is' / 'answer:', cut at the end of its line or sentence."""
    for m in reversed(list(_ANSWER_IS.finditer(text))):
        # Linear: a phrase is passed over only when it is all spaces and '*' up to its end, so
        # the searches of rejected phrases never overlap, and the first accepted one ends the loop.
        end = _PHRASE_END.search(text, m.end())
        phrase = text[m.end() : end.start() if end else len(text)].strip(" \t*")  # '*': markdown bold
        if (n := _NUMBER_THEN_WORDS.match(phrase)) is not None:
            return n.group(1)  # "18 dollars a week" -> "18"
        if phrase:
            return phrase
    return None


# The final-sentence rule: "So the total is 200 dollars." The closing sentence states one number
# with a copula, and nothing else in it is a number, so it cannot be an intermediate step
# ("3 * 4 is 12.") or a comparison ("x is 5 when y is 3."). Ours, for GSM8K-style completions that
# end with neither a box, `####` nor "the answer is" (8 of 200 held-out completions did).
_FINAL_SENTENCE_CHARS = 300  # a closing statement is short; the bound also keeps this rule O(1)
_SENTENCE_START = re.compile(
    r"[.!?](?=\s)|\n|[,;:]\s*(?=(?:so|therefore|thus|hence)\b)", re.IGNORECASE)  # ", so the total is 9."
_STATEMENT = re.compile(
    r"(?P<subject>\D*?)(?:\b(?:is|are|was|were|be|equals)\b|=)\s*"  # subject (no digits), copula
    r"(?P<number>[-\u2212]?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?%?)"  # the one number
    r"(?P<unit>(?:\s+[A-Za-z]+){0,3})\s*[.!]")  # at most three unit words ("miles per hour"), the stop
_NOT_A_RESULT = {  # words that make the sentence a condition, a negation or a relation, not a result
    "subject": {"if", "when", "whether", "unless", "suppose", "assume", "let", "not", "never"},
    "unit": {"more", "less", "fewer", "greater", "smaller", "larger", "than", "times", "plus", "minus",
             "of", "over", "and", "or", "if", "when", "because", "since", "but", "not", "off"},
}


def _final_statement(text: str) -> str | None:
    """The number of a final sentence 'X is/are/was/equals/= <number> [up to 3 unit words].', else None."""
    tail = text.rstrip()[-_FINAL_SENTENCE_CHARS - 1 :]
    starts = [m.end() for m in _SENTENCE_START.finditer(tail, 0, max(len(tail) - 1, 0))]
    if not starts and len(tail) > _FINAL_SENTENCE_CHARS:
        return None  # the last sentence began further back: too long to be a closing statement
    sentence = re.sub(r"\\?\$|\*", "", tail[starts[-1] if starts else 0 :]).strip()  # $, \$, markdown bold
    m = _STATEMENT.fullmatch(sentence)
    if m is None:
        return None  # a question, an unfinished sentence, two numbers, no copula, ...
    words = {part: set(m.group(part).lower().replace("n't", " not").split()) for part in _NOT_A_RESULT}
    if any(words[part] & _NOT_A_RESULT[part] for part in _NOT_A_RESULT):
        return None
    return m.group("number").replace("\u2212", "-")


def extract_answer(completion: str, last_number_fallback: bool = False,
                   final_sentence: bool = True) -> tuple[str | None, str]:
    """Final answer of a completion and the rule that found it: "boxed", "gsm8k", "answer_is",
    "final_sentence", "last_number" (only with the flag) or "none" (answer None). Never raises on a string.

    `final_sentence` is on by default, unlike `last_number_fallback`: it is as strict as "the answer
    is 18 dollars" (a sentence that states one value), and it fires only on a completion's closing
    sentence, while the last number of a text is often an intermediate step. The hub preset keeps
    last_number_fallback off for that reason; the final-sentence rule does not have that weakness."""
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
    if final_sentence and (number := _final_statement(text)) is not None:
        return number, "final_sentence"
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
# Scientific notation, after normalize() took the spaces out: 1.3e-3, 1.3E-3, 1.3\times10^{-3},
# 1.3\cdot10^{5}, 2*10^5, 10^{-3} (Minerva's physics answers). At most 3 exponent digits: the
# exact value is a Fraction, and 1e999999999 would be a billion-digit integer.
_SCI = re.compile(rf"(?:({_SIGNED})(?:[eE]|(?:\\times|\\cdot|\*)10\^)|(?:([+-]?)10\^))"
                  r"(?:\{([+-]?\d{1,3})\}|([+-]?\d{1,3}))")


def _unwrap_box(s: str) -> str:
    """'\\boxed{5}' -> '5' (a reference may come boxed, a box may sit inside a box). The string must
    be one box and nothing else, level after level. One brace table serves every level, so n nested
    boxes cost O(n), not n scans."""
    pairs, lo, hi, bare = None, 0, len(s), False
    while (m := _BOX.match(s, lo, hi)) is not None:  # match, not search: the box must open the level
        if bare:  # inside `\boxed X` every inner box is bare too and ends where X ends
            if m.end() >= hi:
                break  # `\boxed` with nothing after it
            lo = m.end()
            continue
        pairs = _brace_pairs(s) if pairs is None else pairs
        span = _box_span(s, m.end(), pairs)
        if span is None or span[1] > hi or s[span[2] : hi].strip():
            break  # not a box, or text after it: this level is the answer
        lo, hi, bare = span[0], span[1], span[1] == span[2]  # a braced box ends at '}', past its content
    return s[lo:hi]


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
    since 'what percent' questions are answered both ways), scientific notation (1.3e-3,
    1.3\\times10^{-3}). None if `s` is not one of these."""
    if m := _PLAIN.fullmatch(s):
        x = Fraction(m.group(1))
        return {x, x / 100} if m.group(2) else {x}
    if (m := _SLASH.fullmatch(s)) and Fraction(m.group(2)) != 0:
        return {Fraction(m.group(1)) / Fraction(m.group(2))}
    if m := _SCI.fullmatch(s):
        mantissa = Fraction(m.group(1)) if m.group(1) else Fraction(-1 if m.group(2) == "-" else 1)
        return {mantissa * Fraction(10) ** int(m.group(3) or m.group(4))}
    if m := _FRAC.fullmatch(s):
        num, den = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
        if Fraction(den) != 0:
            return {(-1 if m.group(1) == "-" else 1) * Fraction(num) / Fraction(den)}
    return None


# ---------------------------------------------------------------------------------------------
# 3. Symbolic equality (math-verify) under a hard timeout (the guard: engines/grading.py)
# ---------------------------------------------------------------------------------------------
def _symbolic_equal(pred: str, ref: str) -> bool:
    """math-verify on the raw strings (it has its own LaTeX normalization; ours drops spaces, which
    would turn '\\pi r' into '\\pir'). Gold first: math-verify's verify is not symmetric."""
    mv = _load_math_verify()  # a no-op in the parent; in a worker process, imported at its start
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
        return run_with_timeout(_symbolic_equal, timeout_s, pred_raw, ref_raw), "symbolic"
    except _CheckTimeout:
        logger.debug("verify timeout after %.1f s on %.80r", timeout_s, pred)
        return False, "timeout"
    except Exception:  # noqa: BLE001 - model output must never crash training
        logger.debug("verify error on %.80r", pred, exc_info=True)
        return False, "error"


# The teaching CLI: python verify.py COMPLETION ANSWER [flags]
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Score one completion against a reference answer.")
    parser.add_argument("completion", help="model output, e.g. 'so x = \\boxed{\\frac{1}{2}}'")
    parser.add_argument("answer", help="reference answer, e.g. '0.5'")
    parser.add_argument("--last-number-fallback", action="store_true",
                        help="use the last number if no other rule matches")
    parser.add_argument("--no-final-sentence", dest="final_sentence", action="store_false",
                        help="turn off the final-sentence rule ('So the total is 200 dollars.' -> 200)")
    parser.add_argument("--format-reward", type=float, default=0.0,
                        help="bonus for exactly one final \\boxed{} (default 0: off)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per symbolic check")
    args = parser.parse_args(argv)
    g = grade(args.completion, args.answer, last_number_fallback=args.last_number_fallback,
              final_sentence=args.final_sentence, format_reward=args.format_reward, timeout_s=args.timeout)
    print(f"extracted: {g.answer!r}\nrule:      {g.rule}\ncheck:     {g.check}\nreward:    {g.reward}")


if __name__ == "__main__":
    main()
