"""Tests of assignment.py, the course assignment mode: stubs from the real source, the handout, and a
grader that really grades (every part 0 on its stub, full on its own, never moved by another part).

Run: python -m pytest -q tests/test_assignment.py   (~1 min on 2 cores: the isolation check grades a
fresh handout in 10 configurations, 16 pytest runs; the rest takes seconds)
"""
import ast
import dataclasses
import json
import shutil

import pytest

import assignment as A

SOURCE = '''"""A module."""
import math


def kept(x):
    """Not an exercise: copied as it is."""
    return x + 1  # a comment that stays


@staticmethod
def exercise(p, alpha_t: float,
             beta_t: float = 2.0) -> float:
    """Eq. 5: the contract the student codes against.

    Second paragraph, also kept.
    """
    # a solution comment that must go
    log_B = math.lgamma(alpha_t) + math.lgamma(beta_t)
    return math.exp(-log_B) * p
    # a trailing comment inside the body must go too


def after():
    """Still here."""
    return exercise(0.5, 2.0)
'''


# ----------------------------------------------------------------------------------------------
# Stubs from the source, with ast
# ----------------------------------------------------------------------------------------------
def test_stub_keeps_signature_docstring_and_every_other_line():
    out = A.stub_source(SOURCE, {"exercise": "Part 9: the density, paper eq. 5"})
    expected = SOURCE.split("    # a solution comment")[0] + \
        "    raise NotImplementedError('Part 9: the density, paper eq. 5')\n" + \
        "\n\ndef after():" + SOURCE.split("\n\ndef after():")[1]
    assert out == expected  # decorator, 3-line signature, docstring, other functions: byte for byte
    assert "lgamma" not in out and "solution comment" not in out and "trailing comment" not in out
    namespace = {}
    exec(compile(out.replace("@staticmethod\n", ""), "<stub>", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="Part 9: the density, paper eq. 5"):
        namespace["after"]()  # the stub raises where the student has work to do
    assert namespace["kept"](1) == 2


def test_a_listed_function_that_no_longer_exists_is_a_one_line_error():
    with pytest.raises(SystemExit, match="mod.py has no top-level function 'renamed'.*update PARTS"):
        A.stub_source(SOURCE, {"renamed": "Part 1: x"}, "mod.py")
    with pytest.raises(SystemExit, match="no docstring"):
        A.stub_source("def f():\n    return 1\n", {"f": "Part 1: x"}, "mod.py")


def test_table_matches_the_code_and_a_stale_test_id_is_caught(monkeypatch):
    A.check_table()  # every exercise, helper and grading test of PARTS exists right now
    assert [p.number for p in A.PARTS] == [1, 2, 3, 4, 5]
    assert sum(p.points for p in A.PARTS) == 100 and all(p.points > 0 for p in A.PARTS)
    assert A.points_table() in (A.REPO / "docs" / "teaching.md").read_text()  # parts table current
    names = [n for p in A.PARTS for _, n, _ in p.functions]
    assert len(names) == len(set(names))  # one function, one part
    stale = dataclasses.replace(A.PARTS[0], tests=A.PARTS[0].tests + ("tests/test_verify.py::test_gone",))
    monkeypatch.setattr(A, "PARTS", (stale,) + A.PARTS[1:])
    with pytest.raises(SystemExit, match="test_verify.py has no test 'test_gone' \\(grades Part 1\\)"):
        A.check_table()


# ----------------------------------------------------------------------------------------------
# The handout
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    root = tmp_path_factory.mktemp("build") / "handout"
    solution = A.build(root)
    return root, solution


def test_handout_stubs_exactly_the_exercises(handout):
    root, solution = handout
    stubbed = A.stubs_for(A.auto_parts())
    for filename, source in solution.items():
        student = (root / filename).read_text()
        ours, theirs = (A._top_level_functions(s, filename) for s in (source, student))
        assert ours.keys() == theirs.keys()
        for name, node in ours.items():
            if name in stubbed.get(filename, {}):
                body = theirs[name].body
                assert ast.get_docstring(theirs[name]) == ast.get_docstring(node)  # the contract stays
                stub = stubbed[filename][name]
                if isinstance(stub, tuple):  # a fast version that calls the student's function instead
                    assert [ast.unparse(b) for b in body[1:]] == [ast.unparse(ast.parse(x).body[0]) for x in stub]
                    assert "NotImplementedError" not in ast.unparse(theirs[name])
                else:
                    assert len(body) == 2 and ast.unparse(body[1]) == f"raise NotImplementedError({stub!r})"
                assert ast.unparse(node.args) == ast.unparse(theirs[name].args)  # the signature too
            else:
                assert ast.dump(node) == ast.dump(theirs[name]), f"{filename}:{name} changed"
    # everything else is copied as it is (README: all but the measured results, which Part 5 asks for)
    for f in ("train.py", "toy.py", "engines/rollout.py", "tests/test_grpo.py", "tests/conftest.py", "requirements.txt"):
        assert (root / f).read_bytes() == (A.REPO / f).read_bytes(), f
    for f in ("results", "tests/test_assignment.py"):
        assert not (root / f).exists(), f
    readme = (root / "README.md").read_text()
    assert "Yours to measure: see ASSIGNMENT.md, Part 5." in readme
    if "## Results" in (A.REPO / "README.md").read_text():
        assert "| uniform |" not in readme  # the compare table of the solution's README is gone
    if (A.REPO / A.RESULTS_DOC).exists():  # the tables moved to docs/results.md: gone from the handout too
        assert (root / A.RESULTS_DOC).read_text() == A.RESULTS_STUB


def test_handout_text_names_contracts_commands_points_and_questions(handout):
    root, solution = handout
    text = (root / "ASSIGNMENT.md").read_text()
    for part in A.PARTS:
        assert f"## Part {part.number}: {part.title} ({part.points} points" in text
        for filename, name, _ in part.functions:
            assert A._signature_and_docstring(solution[filename], name, filename) in text
        for node in part.tests:
            assert f"    {node}" in text  # the exact command the grader runs
        for q, _ in part.questions:
            assert f"**Q{q}.**" in text
    assert "python assignment.py grade . --part 2" in text
    # the answer sheet: one heading per question, none answered yet; an answer counts once written
    answers = (root / "ANSWERS.md").read_text()
    assert A.answered(answers) == (0, len(A.all_questions()))
    filled = answers.replace(A.ANSWER_PLACEHOLDER, "eq. 8 has p (1 - p) in its exponent ...", 1)
    assert A.answered(filled) == (1, len(A.all_questions()))


def test_build_refuses_to_overwrite_what_is_not_a_handout(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not a handout"):
        A.build(tmp_path)
    with pytest.raises(SystemExit, match="overwrite the project"):
        A.build(A.REPO)


# ----------------------------------------------------------------------------------------------
# Grading
# ----------------------------------------------------------------------------------------------
def test_each_part_graded_alone_zero_on_stub_full_on_solution():
    # The check, in assignment.check's 10 configurations: all stubs (every part 0), each
    # part alone restored (that part full), all but one part restored (that part 0), the solution
    # (every part full). A failure message names the configuration, the part and the failing tests.
    problems = A.check(quiet=True)
    assert problems == [], "\n\n".join(problems)


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A handout where Part 1 is half right, Part 3 kills the interpreter and Part 4 hangs."""
    root = tmp_path_factory.mktemp("broken") / "handout"
    A.build(root)
    stub = {name: msg for table in A.stubs_for(A.auto_parts()).values() for name, msg in table.items()}

    def write(filename, name, body):  # what a student does: replace the raise by a body
        path, raise_line = root / filename, f"raise NotImplementedError({stub[name]!r})"
        assert raise_line in path.read_text()
        path.write_text(path.read_text().replace(raise_line, body))

    # only a plain \boxed{integer} is found (the no-answer cases pass too)
    write("verify.py", "extract_answer", "import re; m = re.findall(r'\\\\boxed\\{(\\d+)\\}', completion); "
          "return (m[-1], 'boxed') if m else (None, 'none')")
    write("coba.py", "global_failure_rate", "__import__('os')._exit(3)")
    write("allocate.py", "allocate", "while True: __import__('time').sleep(1)")  # hangs, idle (load-independent)
    return root


def test_broken_submission_costs_only_its_own_parts(broken):
    rows = {r["part"]: r for r in A.grade(broken, parts={1, 3, 4}, timeout={4: 15.0}, quiet=True)}
    # Part 4's hang must be reached before its timeout: on a loaded machine pytest may not even start a
    # test in 15 s ("Last test started: (none)"); then grade that part again with 4x the time, up to
    # 240 s, so the assertion below stays strict whatever the load (a flake one run in N blocks CI).
    budget = 15.0
    while "Last test started: (none)" in rows[4]["report"] and budget < 240:
        budget *= 4
        rows[4] = A.grade(broken, parts={4}, timeout={4: budget}, quiet=True)[0]
    assert 0 < rows[1]["passed"] < rows[1]["run"] and 0 < rows[1]["score"] < 10  # partial credit
    assert rows[1]["score"] == round(10 * rows[1]["passed"] / rows[1]["run"], 2)  # exact: int / int then round(., 2), the grader's own ops
    assert rows[3]["score"] == 0 and "pytest stopped without a report (exit code 3)" in rows[3]["report"]
    assert rows[4]["score"] == 0 and rows[4]["timed_out"]
    assert f"timed out after {budget:.0f} s" in rows[4]["report"] and "tests/test_allocate.py::" in rows[4]["report"]
    # Gradescope's results.json: one test per part with name, score, max_score, output
    result = A.gradescope_json(list(rows.values()), broken, 12.3)
    assert result["score"] == rows[1]["score"]
    assert [t["max_score"] for t in result["tests"]] == [10, 25, 20]
    assert all(set(t) >= {"name", "score", "max_score", "output"} for t in result["tests"])
    assert "Part 5" in result["output"] and "ANSWERS.md: 0 of" in result["output"]  # graded by hand


def test_grade_cli_prints_the_table_and_writes_the_json(broken, tmp_path, capsys):
    A.main(["grade", str(broken), "--part", "1", "--json", str(tmp_path / "out" / "results.json")])
    printed = capsys.readouterr().out
    assert "The verifiable reward" in printed and "/ 25" not in printed and "by hand" in printed
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["tests"][0]["name"] == "Part 1: The verifiable reward"
    assert 0 < result["score"] == result["tests"][0]["score"] < 10
    assert "FAILED tests/test_verify.py::test_extract_answer" in result["tests"][0]["output"]


# ----------------------------------------------------------------------------------------------
# A submission reaches only its own part (issue 25: 12, 13), and build keeps a student's work
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def submission(handout, tmp_path):
    """A fresh copy of the module's handout, and a way to replace a stub's body (Part 1)."""
    root = tmp_path / "submission"
    shutil.copytree(handout[0], root)
    stub = {name: msg for table in A.stubs_for(A.auto_parts()).values() for name, msg in table.items()}

    def write(filename, name, body, prelude=""):  # prelude: module-level code, run at import
        path, raise_line = root / filename, f"raise NotImplementedError({stub[name]!r})"
        text = (handout[0] / filename).read_text()  # the stub as handed out
        assert raise_line in text
        path.write_text(text.replace(raise_line, body) + "\n" + prelude)  # after any __future__ import

    return root, write


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "tests").rglob("*.py"))}


def test_a_submission_cannot_change_the_tests_it_is_graded_by(submission):
    """Issue 25.12: a student file rewrote tests/test_grpo.py at import and a stub scored 25/25;
    deleting a test file broke the handout for the next submission graded in it."""
    root, write = submission
    tests_before = tree(root)
    # Part 1 stays a stub; at import, verify.py replaces its tests by ones that pass and deletes another
    write("verify.py", "extract_answer", "raise NotImplementedError('still a stub')", prelude=(
        "import os as _os, pathlib as _pl\n"
        "for _t in _pl.Path('tests').glob('test_*.py'):\n"
        "    _os.chmod('tests', 0o755); _os.chmod(_t, 0o644)\n"
        "    if _t.name == 'test_verify.py':\n"
        "        _t.write_text(''.join(f'def {n.split(\"::\")[1]}():\\n    pass\\n' for n in "
        f"{list(A.PARTS[0].tests)!r}))\n"
        "    elif _t.name == 'test_grpo.py':\n"
        "        _t.unlink()\n"))
    for _ in range(2):  # the second grading used to collect the rewritten tests: full marks
        row = A.grade(root, parts={1}, quiet=True)[0]
        assert row["score"] == 0 and "changed the grading tests" in row["report"], row["report"]
    assert tree(root) == tests_before  # the handout itself is only read: the next grading is unharmed


def test_output_and_file_sizes_are_capped(submission):
    """Issue 25.13: output printed in a loop grew the temp folder at ~320 MB/s. pytest captures
    it into a temporary file, which RLIMIT_FSIZE caps; what reaches the grader's pipe is capped too.
    (Bounded loops, at most 32 MB each, so that the test is harmless even where the caps fail.)"""
    root, write = submission
    limits = A.Limits(output_keep=4096, output_kill=2 ** 20, file_size=2 ** 20, disk=2 ** 30)
    write("verify.py", "extract_answer", "[print('x' * 65535) for _ in range(512)]; return (None, 'none')")
    row = A.grade(root, parts={1}, quiet=True, limits=limits)[0]
    assert row["score"] == 0 and "File too large" in row["report"] and "capped at 1 MB" in row["report"]
    # at exit, after pytest gave the pipe back: straight to the grader's pipe
    write("verify.py", "extract_answer", "raise NotImplementedError('stub')", prelude=(
        "import atexit as _a, os as _os\n"
        "_a.register(lambda: [_os.write(1, b'y' * 65536) for _ in range(512)])\n"))
    row = A.grade(root, parts={1}, quiet=True, limits=limits)[0]
    assert row["score"] == 0 and row["stopped"] == "output", row["report"]
    assert "printed more than 1 MB" in row["report"]


def test_rebuild_never_deletes_a_students_work(tmp_path):
    root = tmp_path / "handout"
    A.build(root)
    A.build(root)  # untouched since it was built: replaced
    (root / "verify.py").write_text((root / "verify.py").read_text() + "\n# my work\n")
    (root / "ANSWERS.md").write_text("## Q1.1\n\nmy answer\n")
    with pytest.raises(SystemExit, match=r"holds work since it was built \(ANSWERS.md \(changed\), verify.py "
                                         r"\(changed\)\): pick another --out"):
        A.build(root)
    assert (root / "verify.py").read_text().endswith("# my work\n") and "my answer" in (root / "ANSWERS.md").read_text()
