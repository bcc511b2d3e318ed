"""Every exact float comparison in tests/ says why it may be exact.

The same seeded computation can round differently on another processor (or reach the matrix
library by another route on the same one), so a test may compare floats bit for bit only where
both sides are the same computation, a copy, integers, or a value the formula gives with no
rounding. Each such assertion carries a `# exact: <why>` comment on its line or on one of the
three lines above it; anything else compares with a stated tolerance. docs/testing.md lists the
kinds of reasons. This check reads the test sources only: it cannot tell a wrong reason from a
right one, but it makes every new exact comparison a decision someone wrote down.
"""
import re
from pathlib import Path

# bit for bit, or as good as: rtol=0 with atol 0 or 1e-12 and below (a few float64 roundings of numbers
# near 1); rtol=0 with atol 1e-10 on float64, or any relative tolerance, is a tolerance and stays allowed
EXACT = re.compile(r"torch\.equal\(|assert_array_equal\(|assert_equal\(|rtol=0,\s*atol=(0|1e-(1[2-9]|[2-9]\d))(?![\d.])")
HERE = Path(__file__).resolve().parent
SKIP = {Path(__file__).name, "wiring_mutants.py"}  # this file's own patterns; the mutants' source edits


def unexplained(text: str) -> list[int]:
    lines = text.splitlines()
    return [i + 1 for i, line in enumerate(lines) if EXACT.search(line.split("#")[0])
            and not any("# exact:" in x for x in lines[max(0, i - 3):i + 1])]


def test_every_exact_float_comparison_says_why():
    missing = {p.name: unexplained(p.read_text()) for p in sorted(HERE.glob("*.py")) if p.name not in SKIP}
    missing = {name: lines for name, lines in missing.items() if lines}
    assert not missing, f"exact float comparisons without '# exact: <why>' (file: lines): {missing}"


def test_the_check_finds_an_unexplained_comparison():
    assert unexplained("x = 1\nassert torch.equal(a, b)\n") == [2]
    assert unexplained("torch.testing.assert_close(a, b, rtol=0, atol=0)") == [1]
    assert unexplained("# exact: integer ids\nassert torch.equal(a, b)\n") == []
    assert unexplained("torch.testing.assert_close(a, b, rtol=0, atol=1e-12)") == [1]
    assert unexplained("torch.testing.assert_close(a, b, rtol=0, atol=1e-5)") == []  # a tolerance
    assert unexplained("torch.testing.assert_close(a, b, rtol=0, atol=1e-10)") == []
    assert unexplained("torch.testing.assert_close(a, b, rtol=0, atol=0.15)") == []
