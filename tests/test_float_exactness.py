"""Every exact float comparison in tests/ says why it may be exact.

The same seeded computation can round differently on another processor (or reach the matrix
library by another route on the same one), so a test may compare floats bit for bit only where
both sides are the same computation, a copy, integers, or a value the formula gives with no
rounding. Each such comparison carries a `# exact: <why>` comment (the why not empty) on a line the
comparison's statement spans, or alone on the line just above it; anything else compares with a stated
tolerance. docs/testing.md lists the kinds of reasons. This check reads the test sources with `ast`:
it cannot tell a wrong reason from a right one, but it makes every new exact comparison a decision
someone wrote down.

What counts as exact ("exact-like": no relative tolerance and an absolute one of at most 1e-12):
- torch.equal, tensor.equal, numpy.array_equal / array_equiv, numpy.testing.assert_array_equal /
  assert_equal: always;
- torch.testing.assert_close / assert_allclose, torch.allclose / isclose (and the tensor methods),
  numpy.allclose / isclose, numpy.testing.assert_allclose, math.isclose: when the tolerances in
  effect (the library's defaults filled in: numpy's assert_allclose has atol=0, so `rtol=0` alone is
  exact; np.allclose's rtol=1e-5 applies unless given) are rtol 0 and atol <= 1e-12, however the
  arguments are spelled (keyword or position, any order, 0 or 0.0, split over lines, a module-level
  constant); numpy.testing.assert_(array_)almost_equal with decimal >= 13;
- pytest.approx(x, rel=..., abs=...): pytest applies only `abs` when `abs` is given and `rel` is
  not (_pytest/approx.py, ApproxScalar.tolerance: "If the user specified an absolute tolerance but
  not a relative one, just return the absolute tolerance"), otherwise max(rel * |x|, abs) with
  defaults rel=1e-6, abs=1e-12; so approx(x) is a tolerance, approx(x, abs=1e-12) and
  approx(x, rel=0) are exact-like;
- `==` / `!=` where an operand looks like a float: a float literal (or a list, tuple, set, dict or
  comprehension holding one), a call to float(), .item() or round(x, n), a true division with a
  number, len(), sum() or int() on one side (not `tmp_path / "f"`), or arithmetic on any of these.

What it cannot see: types. `a == b` between two names (tensors or floats), `x == 0` on a float,
`(t == u).all()` on tensors, `x.tolist() == y.tolist()`, and tolerances that are not constants
(function arguments, `**kw`) are not flagged. Integers, strings, lengths, shapes and token ids are
not flagged (`len(x) == 3`, `ids == [1, 2]`); an integer tensor compared with torch.equal is (that
is the reason to write down).
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

TINY = 1e-12  # an absolute tolerance at or below this (and no relative one) is as good as exact
HERE = Path(__file__).resolve().parent
REASON = re.compile(r"#\s*exact:\s*\w")  # `# exact:` followed by a reason
ALIASES = {"np": "numpy", "torch": "torch", "pytest": "pytest", "math": "math"}  # unimported heads
ALWAYS = {"torch.equal", "tensor.equal", "numpy.array_equal", "numpy.array_equiv", "numpy.testing.assert_array_equal",
          "numpy.testing.assert_equal"}
# name -> (position of its relative tolerance, the absolute one's after it; (relative, absolute) names;
# their defaults; keyword-only). None as a default: torch picks by dtype, never exact unless given
TOLERANT = {
    "torch.testing.assert_close": (2, ("rtol", "atol"), (None, None), True),
    "torch.testing.assert_allclose": (2, ("rtol", "atol"), (None, None), True),
    "torch.allclose": (2, ("rtol", "atol"), (1e-5, 1e-8), False),
    "torch.isclose": (2, ("rtol", "atol"), (1e-5, 1e-8), False),
    "tensor.allclose": (1, ("rtol", "atol"), (1e-5, 1e-8), False),  # t.allclose(other, rtol, atol)
    "tensor.isclose": (1, ("rtol", "atol"), (1e-5, 1e-8), False),
    "numpy.allclose": (2, ("rtol", "atol"), (1e-5, 1e-8), False),
    "numpy.isclose": (2, ("rtol", "atol"), (1e-5, 1e-8), False),
    "numpy.testing.assert_allclose": (2, ("rtol", "atol"), (1e-7, 0.0), False),
    "math.isclose": (2, ("rel_tol", "abs_tol"), (1e-9, 0.0), True),
}
# unresolved bare names (imported some way this check does not follow) -> their usual home
BARE = {"equal": "torch.equal", "array_equal": "numpy.array_equal", "array_equiv": "numpy.array_equiv",
        "assert_array_equal": "numpy.testing.assert_array_equal", "assert_equal": "numpy.testing.assert_equal",
        "assert_close": "torch.testing.assert_close", "assert_allclose": "numpy.testing.assert_allclose",
        "allclose": "torch.allclose", "isclose": "torch.isclose", "approx": "pytest.approx",
        "assert_almost_equal": "numpy.testing.assert_almost_equal",
        "assert_array_almost_equal": "numpy.testing.assert_array_almost_equal"}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Checker(ast.NodeVisitor):
    def __init__(self, tree):
        self.imports, self.consts, self.hits, self.statement = {}, {}, [], {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
        for stmt in ast.walk(tree):  # a simple statement (assert, assignment, call) holds no other
            if isinstance(stmt, ast.stmt) and not hasattr(stmt, "body"):
                for node in ast.walk(stmt):
                    self.statement[node] = stmt
        for node in tree.body:  # module-level constants a tolerance may name (TOL = 1e-6)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = self.number(node.value)
                if value is not None:
                    self.consts[node.targets[0].id] = value

    def number(self, node):
        """The value of a constant tolerance expression, or None where it is not one."""
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in self.consts:
            return self.consts[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.number(node.operand)
            return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp):
            a, b = self.number(node.left), self.number(node.right)
            ops = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__,
                   ast.Div: float.__truediv__, ast.Pow: float.__pow__}
            if a is not None and b is not None and type(node.op) in ops:
                try:
                    return ops[type(node.op)](a, b)
                except (ZeroDivisionError, OverflowError):
                    return None
        return None

    def name(self, func):
        """The called function's home ("numpy.testing.assert_allclose"), a method ("tensor.<name>"), or None."""
        dotted = _dotted(func)
        if dotted is None:  # a method of an expression: (a - b).equal(c), x.float().allclose(y)
            return f"tensor.{func.attr}" if isinstance(func, ast.Attribute) else None
        head, _, rest = dotted.partition(".")
        home = self.imports.get(head) or ALIASES.get(head)
        if home is None:
            if not rest:
                return BARE.get(head)
            return f"tensor.{func.attr}"  # a method of a name: a tensor's t.equal(u), t.allclose(u)
        return f"{home}.{rest}" if rest else home

    def hit(self, node, what):
        span = self.statement.get(node, node)  # the simple statement around it, else the node itself
        self.hits.append((node.lineno, span.lineno, span.end_lineno, what))

    def visit_Call(self, node):
        name = self.name(node.func)
        if name in ALWAYS:
            self.hit(node, name)
        elif name in TOLERANT:
            first, (rel_name, abs_name), defaults, keyword_only = TOLERANT[name]
            values = []
            for k, (pname, default) in enumerate(zip((rel_name, abs_name), defaults)):
                given = _arg(node, None if keyword_only else first + k, pname)
                values.append(default if given is None else self.number(given))
            if all(v is not None for v in values) and values[0] == 0 and abs(values[1]) <= TINY:
                self.hit(node, f"{name}(rtol={values[0]:g}, atol={values[1]:g})")
        elif name in ("numpy.testing.assert_almost_equal", "numpy.testing.assert_array_almost_equal"):
            given = _arg(node, 2, "decimal")
            decimal = 6 if given is None else self.number(given)
            if decimal is not None and 1.5 * 10 ** -decimal <= TINY:
                self.hit(node, f"{name}(decimal={decimal:g})")
        elif name == "pytest.approx":
            rel_node, abs_node = _arg(node, 1, "rel"), _arg(node, 2, "abs")
            rel, absolute = self.number(rel_node), self.number(abs_node)
            if _is_none(rel_node) and not _is_none(abs_node):
                exact = absolute is not None and absolute <= TINY  # pytest applies abs alone
            elif not _is_none(rel_node):
                exact = rel == 0 and (_is_none(abs_node) or (absolute is not None and absolute <= TINY))
            else:
                exact = False  # approx(x): rel 1e-6
            if exact:
                self.hit(node, f"pytest.approx(rel={rel}, abs={absolute})")
        self.generic_visit(node)

    def visit_Compare(self, node):
        operands = [node.left, *node.comparators]
        for op, a, b in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)) and not (self.is_approx(a) or self.is_approx(b)) \
                    and (self.floaty(a) or self.floaty(b)):
                self.hit(node, "==" if isinstance(op, ast.Eq) else "!=")
                break
        self.generic_visit(node)

    def is_approx(self, node):
        return isinstance(node, ast.Call) and self.name(node.func) == "pytest.approx"

    def floaty(self, node):
        """Whether an expression looks like a float: see the module's docstring for what it cannot see."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, float)
        if isinstance(node, ast.UnaryOp):
            return self.floaty(node.operand)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return any(self.floaty(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return any(self.floaty(v) for v in node.values)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.floaty(node.elt)
        if isinstance(node, ast.BinOp):  # a / b is a float where one side is a number (not a path join)
            return self.floaty(node.left) or self.floaty(node.right) or isinstance(node.op, ast.Div) and \
                (self.numeric(node.left) or self.numeric(node.right))
        if isinstance(node, ast.Call):
            return (isinstance(node.func, ast.Name) and (node.func.id == "float" or node.func.id == "round"
                                                         and len(node.args) + len(node.keywords) == 2)) or \
                (isinstance(node.func, ast.Attribute) and node.func.attr == "item" and not node.args)
        return False

    def numeric(self, node):
        """A number, len() / sum() / int() / a count, or arithmetic on them (what makes `/` a float division)."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.BinOp):
            return self.numeric(node.left) or self.numeric(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.numeric(node.operand)
        return self.floaty(node) or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in ("len", "sum", "int", "abs", "min", "max")


def _arg(call, position, keyword):
    """The argument given for a parameter (by keyword, or by position where it may be), or None."""
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[position] if position is not None and len(call.args) > position else None


def _is_none(node):
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def exact_comparisons(text: str) -> list[tuple[int, int, int, str]]:
    """(line, first and last line of its statement, what) for each exact float comparison in a source."""
    checker = _Checker(tree := ast.parse(text))
    checker.visit(tree)
    return sorted(set(checker.hits))


def unexplained(text: str) -> list[int]:
    """The lines of exact comparisons with no `# exact: <why>` on their statement's lines or alone on the line above."""
    comments = [tok for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT and REASON.search(tok.string)]
    reasons = {tok.start[0] for tok in comments}
    alone = {tok.start[0] for tok in comments if tok.line.lstrip().startswith("#")}  # a line of its own
    return sorted({line for line, first, last, _ in exact_comparisons(text)
                   if not reasons & set(range(first, last + 1)) and first - 1 not in alone})


def test_every_exact_float_comparison_says_why():
    missing = {p.name: unexplained(p.read_text()) for p in sorted(HERE.glob("*.py"))}
    missing = {name: lines for name, lines in missing.items() if lines}
    assert not missing, f"exact float comparisons without '# exact: <why>' (file: lines): {missing}"


# one exact comparison each, in every spelling the check reads (a split call, keywords in any order, 0.0)
EXACT = [
    "assert torch.equal(a, b)",
    "assert t.equal(u)",
    "assert np.array_equal(a, b)",
    "np.testing.assert_array_equal(a, b)",
    "from numpy.testing import assert_equal\nassert_equal(a, b)",
    "torch.testing.assert_close(a, b, rtol=0, atol=0)",
    "torch.testing.assert_close(a, b, atol=0, rtol=0.0)",
    "torch.testing.assert_close(a, b, rtol=0, atol=1e-12)",
    "torch.testing.assert_close(\n    a, b,\n    atol=0.0,\n    rtol=0,\n)",
    "import torch.testing as tt\ntt.assert_close(a, b, rtol=0, atol=0)",
    "np.testing.assert_allclose(a, b, rtol=0)",  # numpy's atol defaults to 0
    "np.testing.assert_allclose(a, b, 0)",
    "from numpy.testing import assert_allclose\nassert_allclose(a, b, rtol=0.0, atol=1e-13)",
    "TOL = 0\nnp.testing.assert_allclose(a, b, rtol=TOL)",
    "np.testing.assert_almost_equal(a, b, decimal=15)",
    "assert np.allclose(a, b, rtol=0, atol=0)",
    "assert np.isclose(a, b, atol=0, rtol=0)",
    "assert torch.allclose(a, b, 0, 0)",
    "assert t.allclose(u, rtol=0, atol=1e-12)",
    "assert math.isclose(a, b, rel_tol=0)",
    "assert x == pytest.approx(y, abs=0)",
    "assert x == pytest.approx(y, abs=1e-12)",  # pytest applies abs alone when rel is not given
    "assert x == pytest.approx(y, rel=0)",  # abs then defaults to 1e-12
    "assert x == pytest.approx(\n    y,\n    abs=0.0)",
    "from pytest import approx\nassert x == approx(y, None, 0)",
    "assert x == 0.0",
    "assert x != -1.5",
    "assert loss.item() == other.item()",
    "assert float(a) == b",
    "assert xs.tolist() == [0.5, 1.0]",
    "assert got == {'acc': 0.25}",
    "assert r['frac'] == r['count'] / len(rows)",
    "assert r['rate'] == round(p, 4)",
    "assert [float(x) for x in xs] == ys",
]
# not exact: tolerances, or comparisons of what is not a float
NOT_EXACT = [
    "torch.testing.assert_close(a, b)",
    "torch.testing.assert_close(a, b, rtol=0, atol=1e-10)",
    "torch.testing.assert_close(a, b, rtol=0, atol=0.15)",
    "torch.testing.assert_close(a, b, rtol=1e-6, atol=0)",
    "np.testing.assert_allclose(a, b)",  # rtol 1e-7
    "np.testing.assert_allclose(a, b, atol=1e-12)",  # rtol 1e-7 still applies
    "assert np.allclose(a, b, atol=0)",  # rtol 1e-5
    "assert torch.allclose(a, b)",
    "assert math.isclose(a, b)",
    "np.testing.assert_almost_equal(a, b)",
    "assert x == pytest.approx(y)",  # rel 1e-6
    "assert x == pytest.approx(y, abs=1e-9)",
    "assert x == pytest.approx(y, rel=1e-9)",
    "assert x == pytest.approx(y, rel=0, abs=1e-6)",
    "assert x == pytest.approx(0.5)",
    "assert loss.item() == pytest.approx(0.5)",
    "np.testing.assert_allclose(a, b, rtol=tol)",  # a tolerance the check cannot read
    "assert len(x) == 3",
    "assert ids == [1, 2]",
    "assert name == 'toy' and flag == True",
    "assert t.shape == (2, 3)",
    "assert tmp_path / 'f' == p",
    "assert step == 1 and counters['rollouts'] == 6",
    "assert x < 0.5 and y >= 1e-3",
]


@pytest.mark.parametrize("code", EXACT)
def test_the_check_finds_each_spelling(code):
    last = len(code.splitlines())
    assert unexplained(code), code
    assert unexplained(code + "  # exact: a copy") == [], code  # on the last line it spans
    if last == 1:
        assert unexplained("# exact: a copy\n" + code) == [], code  # or on the line above


@pytest.mark.parametrize("code", NOT_EXACT)
def test_the_check_leaves_tolerances_and_non_floats_alone(code):
    assert exact_comparisons(code) == [], code


def test_the_reason_must_be_written_and_near():
    code = "x = 1\nassert torch.equal(a, b)\n"
    assert unexplained(code) == [2]
    assert unexplained("x = 1\nassert torch.equal(a, b)  # exact: integer ids\n") == []
    assert unexplained("# exact: integer ids\nassert torch.equal(a, b)\n") == []
    assert unexplained("# exact: integer ids\nx = 1\nassert torch.equal(a, b)\n") == [3]  # too far above
    assert unexplained("x = 1\nassert torch.equal(a, b)  # exact:\n") == [2]  # no reason given
    assert unexplained("x = 1\nassert torch.equal(a, b)  # exact:   \n") == [2]
    assert unexplained("assert torch.equal(a, b), '# exact: a string, not a comment'\n") == [1]
    # a split statement: the reason may sit on any of its lines
    assert unexplained("assert torch.equal(\n    a,  # exact: a copy\n    b)\n") == []
    assert unexplained("assert x == 0.5  # exact: dyadic\nassert y == 0.25\n") == [2]  # another line's reason
