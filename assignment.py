"""Course assignment mode: turn coba-rl into a GRPO + CoBA-RL homework, and grade it.

Modelled on Stanford CS336 assignment 5 (GRPO): a starter repository whose exercise functions are
stubs, a written handout, and the project's own tests as the autograder. The exercises follow the
paper (CoBA-RL, arXiv 2602.03048) and one training step of train.py:

    Part 1  the verifiable reward            paper §2.1 (binary R, eq. 1)     verify.py
    Part 2  GRPO on ragged groups            paper §2.1, App. C; DeepSeekMath grpo.py
    Part 3  the capability value             paper §2.3, eqs. 4-9             coba.py
    Part 4  Algorithm 1                      paper §2.4, App. A               allocate.py
    Part 5  experiments + written answers    paper §3 (graded by hand)        compare.py, harness/stats.py

Commands:
    python assignment.py build [--out handout]      student version of the project + ASSIGNMENT.md
                                                    (replaces an earlier handout only if unchanged)
    python assignment.py grade [DIR] [--json PATH]  score table + Gradescope results JSON
    python assignment.py check                      the isolation check (what the CI test runs)

How it works, and why:
  - The solution files carry no markers. `build` parses them with `ast`, finds each exercise by
    name and keeps its signature and docstring (the contract the student codes against); the body
    becomes `raise NotImplementedError("Part N: ...")`. A listed function that no longer exists is
    a one-line error, so the table below cannot silently drift from the code.
  - Everything else (train.py wiring, toy.py, engines/rollout.py, the tests) is copied as it is, so a
    student who finishes all four parts can run `python train.py`. Left out: results/, the
    README's Results section and docs/results.md (Part 5 asks the student to produce and explain
    them; the two keep a one-line pointer so links resolve), tests/test_assignment.py (it needs
    the solution), and the lecture notebook with its test (notebooks/: its outputs show the results
    Part 5 asks for, and it calls the functions the student writes).
  - `grade` runs each part's tests in its own pytest subprocess with a timeout: a student function
    that hangs or kills the interpreter costs that part only. Score = points x passed / run.
  - A submission reaches only its own part: each part runs in a fresh folder holding the
    project's files and pristine tests (from the grader's project, never from the submitted folder,
    which is only read) plus the four submitted files; the tests are read-only and fingerprinted
    (inode, ctime, sha256), and a part whose tests changed scores 0. Output is streamed through a
    pipe (the last 256 KB kept, the part stopped beyond 16 MB), every file is capped by RLIMIT_FSIZE
    (256 MB: pytest's capture file, where a print loop goes, included) and the folder at 1 GB.
    Not a sandbox: the tests run in the submission's process, so a determined one could still forge
    pytest's report; run the grader in a container per submission (Gradescope does).
  - Each part is graded by tests that call only that part's functions. Many other tests call an
    exercise indirectly (allocate_budgets -> capability_value, reward -> extract_answer), so they
    are not graded: with another part still a stub they would fail for the wrong reason. `check`
    proves the choice on a fresh build: every part scores 0 on the stubs, full with only its own
    functions restored, 0 with every other part restored, and full on the untouched solution
    (tests/test_assignment.py runs it in CI, ~1 min on 2 cores).
  - Part 5 is graded by hand (ours): its answers are prose. `grade` only reports whether
    ANSWERS.md exists and how many questions have an answer; the JSON's tests hold Parts 1-4.

Test: tests/test_assignment.py
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from harness.paths import check_path

REPO = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 300  # per part; the solution's slowest part (GRPO, a tiny Qwen2) takes ~10 s
ANSWER_PLACEHOLDER = "_(your answer)_"


# ----------------------------------------------------------------------------------------------
# The exercise table: what is stubbed, what grades it, what the handout says
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    number: int
    title: str
    paper: str           # where in the paper (and its sources) this part lives
    points: int
    about: str           # the handout's introduction to the part
    functions: tuple = ()  # (file, function, stub message after "Part N: ")
    helpers: tuple = ()    # (file, function): given helpers to show besides those the solution calls
    tests: tuple = ()      # pytest node ids that grade the part; () = graded by hand
    notes: tuple = ()      # what the tests check beyond the docstrings: text, or (text, needle) below
    questions: tuple = ()  # (id, text): written questions, answered in ANSWERS.md
    # (file, function, body lines): a fast version of an exercise whose body, in the handout, calls the
    # student's function instead (it would otherwise hand them a working solution)
    delegates: tuple = ()


PARTS = (
    Part(1, "The verifiable reward", "paper §2.1 (binary reward R in {0, 1}; eq. 1 averages it)", 10,
         about="RLVR scores a rollout by checking its final answer against the reference: no reward model. "
               "CoBA-RL assumes exactly this binary reward: a prompt's pass rate p_i (eq. 1) is the mean of "
               "these rewards over its rollouts, and the failure rate F_t (eq. 4) is built from them. You write "
               "the first half of the verifier: finding the final answer in a completion. Comparing answers "
               "(normalisation, the numeric fast path, math-verify under a timeout) is given.",
         functions=(("verify.py", "extract_answer",
                     "extract the final answer and the rule that found it, the binary reward of paper §2.1"),),
         tests=("tests/test_verify.py::test_extract_answer",
                "tests/test_verify.py::test_toy_bare_integers_with_fallback",
                "tests/test_verify.py::test_rewards_batch_and_stats"),
         notes=("The rules, in order, are in the docstring and in step 1 of the \"Pipeline\" in verify.py's "
                "module docstring: the first rule that matches wins, and within a rule the last occurrence in "
                "the text wins (several boxes: the last one).",
                "A box inside a box is unwrapped (`\\boxed{\\boxed{5}}` -> `5`); an unclosed box (a truncated "
                "completion) is skipped; an empty box is no answer.",
                "Nothing matches: return `(None, \"none\")`. Never raise on a string: model output is arbitrary.",
                "`test_toy_bare_integers_with_fallback` and `test_rewards_batch_and_stats` reach your function "
                "through `reward` / `rewards`, the way train.py does (the toy task's completions are bare "
                "integers such as `17`)."),
         questions=(("1.1", "With `--format-reward 0.1` the reward is no longer binary. Which quantities of "
                            "CoBA-RL (eqs. 1 and 4) change meaning, and what would that do to the allocation?"),)),
    Part(2, "GRPO on ragged groups", "paper §2.1 and App. C; DeepSeekMath §4.1 (eqs. 3-4), DAPO §3.1, §3.3", 25,
         about="CoBA-RL gives prompt i its own number of rollouts B_i, so GRPO's groups have different sizes. "
               "TRL computes group means with `rewards.view(-1, num_generations)`, which assumes equal groups; "
               "here every group statistic is a scatter over `group_ids`. Then the clipped surrogate with DAPO's "
               "clip-higher and the k3 KL estimate, and the three ways to turn per-token losses into one number. "
               "`per_token_logps` (the model side) and `policy_update` (App. C's update around your loss) are given.",
         functions=(("grpo.py", "group_advantages",
                     "group-relative advantages on ragged groups, DeepSeekMath §4.1.2 (paper §2.1: group i has B_i rollouts)"),
                    ("grpo.py", "clipped_policy_loss",
                     "clipped surrogate with clip-higher and k3 KL, DeepSeekMath eqs. 3-4 and DAPO §3.1 (paper App. C)"),
                    ("grpo.py", "aggregate_loss",
                     "loss aggregation dapo / grpo / dr_grpo, DAPO §3.3 and DeepSeekMath eq. 3 (paper App. C: token mean)")),
         tests=("tests/test_grpo.py::test_group_advantages_hand_computed_ragged_groups",
                "tests/test_grpo.py::test_group_advantages_eps_std_off_and_float32",
                "tests/test_grpo.py::test_group_advantages_equal_non_binary_rewards_are_exactly_zero",
                "tests/test_grpo.py::test_aggregate_loss_hand_computed",
                "tests/test_grpo.py::test_normalizer_makes_micro_batches_sum_to_full_batch",
                "tests/test_grpo.py::test_clip_higher_hand_computed",
                "tests/test_grpo.py::test_k3_kl_hand_computed",
                "tests/test_grpo.py::test_loss_ignores_masked_positions",
                "tests/test_grpo.py::test_clipped_policy_loss_gradcheck",
                "tests/test_grpo.py::test_loss_and_gradient_match_reference_on_tiny_model",
                "tests/test_grpo.py::test_on_policy_ratio_is_one_and_gradient_is_plain_policy_gradient"),
         notes=("Never reshape rewards into (M, G): groups differ in size and a group's rows need not be "
                "contiguous. `torch.unique(group_ids, return_inverse=True)`, `torch.bincount`, `index_add_` and "
                "`scatter_reduce` do every group statistic in a few lines.",
                "A group of size 1, or whose rewards are all equal, gets advantage exactly 0. Test it by max == min, "
                "not std == 0: the float64 mean of three 0.1s is not exactly 0.1.",
                "Masked positions of `logps`, `old_logps` and `ref_logps` may hold nan or inf (padding). They must "
                "reach neither the loss nor the gradient: select with `torch.where` before `exp`; multiplying by "
                "the mask is not enough (0 * nan = nan).",
                "`clipped_policy_loss` with `beta != 0` and no `ref_logps` raises a ValueError whose message "
                "names `ref_logps`. Its metrics are python floats; it aggregates through your `aggregate_loss`.",
                "`test_loss_and_gradient_match_reference_on_tiny_model` checks loss and gradient against GRPO "
                "written out token by token on a tiny Qwen2 (float64, a few seconds)."),
         questions=(("2.1", "All B_i rollouts of a prompt got reward 0. What are their advantages and what gradient "
                            "do they give? If the prompt's true pass rate is 0.05, how likely is a group of B_i = 2 "
                            "to carry any signal, and one of B_i = 16? (Write the formula.)"),)),
    Part(3, "The capability value", "paper §2.3, eqs. 4-9 (App. A for the closed form)", 25,
         about="How much is one more rollout of prompt x_i worth? CoBA-RL multiplies a Beta-shaped preference "
               "over the pass rate p_i, whose peak follows the model's global failure rate (eqs. 4-7, 5), by a "
               "saturation factor in the budget B_i (eq. 8). While the model fails a lot the density peaks at easy "
               "prompts (exploit); as it improves the peak moves to hard ones (explore). `_out` turns 0-d numpy "
               "results into python floats.",
         functions=(("coba.py", "global_failure_rate", "global failure rate F_t = 1 - S_t, paper eq. 4"),
                    ("coba.py", "transform_failure_rate", "nonlinear transform F_tilde = Psi(F_bar), paper eq. 6"),
                    ("coba.py", "beta_params", "Beta shape parameters alpha_t, beta_t, paper eq. 7"),
                    ("coba.py", "preference_density", "Beta preference density over p, paper eq. 5"),
                    ("coba.py", "saturation", "budget saturation factor eta(B, p), paper eq. 8"),
                    ("coba.py", "capability_value", "capability value V(B, p) = eta * Density, paper eq. 9")),
         tests=("tests/test_coba.py::test_global_failure_rate_is_one_minus_mean_pass_rate",
                "tests/test_coba.py::test_tracker_failure_rate_is_averaged_over_prompts_not_rollouts",
                "tests/test_coba.py::test_transform_failure_rate_paper_examples",
                "tests/test_coba.py::test_transform_failure_rate_continuous_at_half",
                "tests/test_coba.py::test_beta_params_released_defaults",
                "tests/test_coba.py::test_figure4_pairs_come_from_eq7",
                "tests/test_coba.py::test_tracker_unseen_prompts_get_prior",
                "tests/test_coba.py::test_density_integrates_to_one",
                "tests/test_coba.py::test_density_closed_forms",
                "tests/test_coba.py::test_density_no_overflow_at_large_kappa",
                "tests/test_coba.py::test_saturation_by_hand_and_shape",
                "tests/test_coba.py::test_capability_value_is_saturation_times_density_with_clipped_p",
                "tests/test_coba.py::test_marginal_gain_matches_prop_2_2_and_decreases",
                "tests/test_coba.py::test_value_peaks_at_easier_prompts_when_failure_rate_is_high"),
         notes=("Use numpy and broadcast: `p` may be a scalar or an array, and `saturation`/`capability_value` "
                "take budgets of shape (B, 1) against pass rates (M,). Scalars in, python floats out (`_out`).",
                "Eq. 4 averages over prompts, not rollouts: prompts that failed 1 of 2 and 8 of 8 give "
                "F = (0.5 + 1) / 2 = 0.75, not 9/10 (`CapabilityTracker.update` calls your function).",
                "Eq. 7's alpha_min, alpha_max, lambda are not in the paper: the defaults are the released code's "
                "(1, kappa - 1, kappa - 2), so the Figure 4 pairs (7.26, 3.74), (4.50, 6.50), (2.54, 8.46) come out.",
                "Eq. 5 in log space with `math.lgamma`: `math.gamma(200)` overflows and a test uses "
                "alpha_t = beta_t = 100. An exponent of exactly 0 contributes a factor 1 even at p = 0 or 1 "
                "(0^0 = 1), so Beta(1, 1) is 1 everywhere.",
                "Eq. 9 clips p to [0.01, 0.99] (`P_CLIP`, released code) before both factors."),
         questions=(("3.1", "Why does eq. 8 vanish at p = 0 and p = 1, and what does that do to a prompt the model "
                            "never solves? What does eq. 9's clip of p to [0.01, 0.99] change about it?"),
                    ("3.2", "By hand: F_bar = 0.3 and kappa = 11. Compute F_tilde (eq. 6), alpha_t and beta_t "
                            "(eq. 7), and the pass rate where the density of eq. 5 peaks. Exploit or explore?"))),
    Part(4, "Algorithm 1: heap-based greedy allocation", "paper §2.4, Algorithm 1; App. A, Prop. 2.2; eq. 3", 20,
         about="Maximise sum_i V_i(B_i) subject to sum_i B_i = B_total and B_low <= B_i <= B_up (eq. 3). Every "
               "prompt starts at B_low; the surplus goes one unit at a time to the prompt whose next unit gains "
               "the most, kept in a max-heap. Because eq. 9's marginal gain falls geometrically in B (App. A), "
               "this greedy is exactly optimal. The exact DP (`allocate_dp`) and the dispatcher are given.",
         functions=(("allocate.py", "allocate", "heap-based greedy allocation, paper §2.4 Algorithm 1"),),
         helpers=(("allocate.py", "budget_grid"), ("allocate.py", "value_columns")),
         tests=("tests/test_allocate.py::test_heap_equals_dp_on_250_random_concave_cases",
                "tests/test_allocate.py::test_heap_and_dp_equal_brute_force_on_tiny_cases",
                "tests/test_allocate.py::test_heap_small_example_by_hand",
                "tests/test_allocate.py::test_value_function_and_table_give_the_same_allocation",
                "tests/test_allocate.py::test_step_moves_budgets_in_multiples_of_step",
                "tests/test_allocate.py::test_non_concave_values_greedy_is_only_a_heuristic",
                "tests/test_allocate.py::test_threshold_equals_heap_on_random_cases"),
         notes=("Start from `budget_grid(...)` and `value_columns(...)`: they check the input (budgets, step, the "
                "values' shape and sign; the tests expect their errors) and give the surplus R, the deepest "
                "level D and the values on the budget grid as a table; their docstrings say what each means.",
                "Python's `heapq` is a min-heap: push (-gain, i). Break ties by the smaller prompt index.",
                "Return plain python ints (train.py uses them as group sizes).",
                "The tests compare objectives with the exact DP and brute force, not allocation vectors (optima "
                "need not be unique). On non-concave values the greedy must still be feasible, and may be worse.",
                "speedups/lazy_heap.py holds the same greedy with its values computed lazily (what training "
                "calls); in this handout it calls your `allocate` instead, so training runs your heap."),
         delegates=(("speedups/lazy_heap.py", "allocate_lazy",
                     ("import allocate  # this handout: your Algorithm 1 (Part 4) stands in for the fast version",
                      "return allocate.allocate(value_fn, num_prompts, total_budget, min_budget, max_budget, step)")),),
         questions=(("4.1", "Give a value table for two prompts and a budget on which Algorithm 1 is not optimal. "
                            "Which property of eq. 9 (App. A, Prop. 2.2) rules this out for CoBA-RL's value?"),)),
    Part(5, "Experiments and written answers", "paper §3 (Table 1, Figures 1, 4, 6)", 20,
         about="Graded by hand from ANSWERS.md: the written questions of Parts 1-4 (2 points each) and the four "
               "experiment questions below (3 points each). Answer in a few sentences with numbers from your "
               "own runs; plots may be linked. `compare.py` runs each arm (an allocator, optionally with "
               "our in-step `--probe`) at an equal rollout budget on the offline toy, paired over seeds, and "
               "writes results/PRESET/table.md, compare.jsonl and five plots; flags it does not know go to "
               "train.py.",
         questions=(("5.1", "Run `python compare.py --preset headline --seeds 0 1` (12 runs, about 10 minutes "
                            "on 2 cores). Copy the table it prints. Which arm ends "
                            "best? Is its difference from uniform larger than its 95% interval can resolve, and "
                            "than the standard error of one evaluation on 1,024 problems (the table's footer)?"),
                    ("5.2", "Open results/headline/alpha_beta_failure.png. Did F_t fall below 0.5? Which branch of "
                            "eq. 6 was active, so where did the density of eq. 5 peak over training? Did the run "
                            "ever reach the paper's explore phase? Then run the same two seeds on the second "
                            "starting model (`python compare.py --preset headline --seeds 0 1 --model toy-strong`: "
                            "tables in results/headline-toy-strong) and answer the same questions there."),
                    ("5.3", "results/headline/zero_signal.png and budget_vs_pass_rate.png: CoBA spends fewer "
                            "rollouts on zero-signal groups than uniform GRPO. Did that buy accuracy? Give one "
                            "mechanism for your answer (where does the budget go, and what happens to prompts "
                            "last seen at p = 0 with and without `--probe`?)."),
                    ("5.4", "Pick one knob (`--max-budget 16`, `--tau 3`, `--failure-window 3`, "
                            "`--prompts-per-step 64`, `--schedule explore2exploit`). Predict its effect from the "
                            "equations first, then run `python compare.py --seeds 0 1 --arms uniform coba "
                            "--out results/knob KNOB` (a separate --out, so the runs are not mistaken for the "
                            "headline's finished ones) and report what happened."))),
)
EXERCISE_FILES = sorted({f for part in PARTS for f, _, _ in part.functions})
DELEGATE_FILES = sorted({f for part in PARTS for f, _, _ in part.delegates} - set(EXERCISE_FILES))  # not submitted


def auto_parts(parts=PARTS) -> list[Part]:
    """The parts the autograder scores (those with tests)."""
    return [p for p in parts if p.tests]


# ----------------------------------------------------------------------------------------------
# Stubs from the real source, with ast
# ----------------------------------------------------------------------------------------------
def _top_level_functions(source: str, filename: str) -> dict:
    """name -> ast.FunctionDef of every top-level function of a module."""
    tree = ast.parse(source, filename=filename)
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _find(functions: dict, name: str, filename: str):
    if name not in functions:
        raise SystemExit(f"assignment: {filename} has no top-level function {name!r} any more: "
                         f"update PARTS in assignment.py")
    return functions[name]


def _docstring_node(fn: ast.FunctionDef, filename: str):
    first = fn.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        raise SystemExit(f"assignment: {filename}:{fn.name} has no docstring, and the docstring is the "
                         f"student's contract: add one")
    return first


def stub_source(source: str, stubs: dict, filename: str = "<source>") -> str:
    """`source` with the body of each function in `stubs` (name -> message) replaced by
    `raise NotImplementedError(message)` (or, where the value is a tuple of lines, by those lines);
    signature, decorators and docstring are kept, and so is every other line of the file, byte for byte."""
    functions = _top_level_functions(source, filename)
    lines = source.splitlines(keepends=True)
    nodes = [_find(functions, name, filename) for name in stubs]
    for fn in sorted(nodes, key=lambda n: n.lineno, reverse=True):  # bottom up: line numbers stay valid
        doc = _docstring_node(fn, filename)
        start, end = doc.end_lineno, fn.end_lineno  # 0-based slice [start, end) is the body after the docstring
        while end < len(lines) and re.match(r"[ \t]+#", lines[end]):  # comments trailing the body
            end += 1
        indent = " " * doc.col_offset
        body = stubs[fn.name]
        lines[start:end] = ([f"{indent}raise NotImplementedError({body!r})\n"] if isinstance(body, str)
                            else [f"{indent}{line}\n" for line in body])
    out = "".join(lines)
    ast.parse(out, filename=filename)  # a stub that does not parse is our bug, not the student's
    return out


def stubs_for(parts) -> dict:
    """file -> {function: stub message} for the given parts."""
    table: dict = {}
    for part in parts:
        for filename, name, what in part.functions:
            table.setdefault(filename, {})[name] = f"Part {part.number}: {what}"
        for filename, name, body in part.delegates:
            table.setdefault(filename, {})[name] = tuple(body)
    return table


def write_exercise_files(root: Path, solution: dict, stubbed_parts) -> dict:
    """Write the exercise files into `root` from the solution texts (file -> source), with the
    functions of `stubbed_parts` stubbed and all others as in the solution; returns what it wrote."""
    table = stubs_for(stubbed_parts)
    written = {}
    for filename, source in solution.items():
        written[filename] = stub_source(source, table[filename], filename) if filename in table else source
        (root / filename).write_text(written[filename])
    return written


def _signature_and_docstring(source: str, name: str, filename: str) -> str:
    """The function's `def` line(s) and docstring, as the student sees them in the stub."""
    fn = _find(_top_level_functions(source, filename), name, filename)
    doc = _docstring_node(fn, filename)
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    return "".join(source.splitlines(keepends=True)[first - 1:doc.end_lineno]).rstrip() + "\n"


def _test_names(source: str, filename: str) -> set:
    return {n for n in _top_level_functions(source, filename) if n.startswith("test_")}


# ----------------------------------------------------------------------------------------------
# build: the student version of the project
# ----------------------------------------------------------------------------------------------
LEFT_OUT = ("results/", "tests/test_assignment.py", "notebooks/", "tests/test_notebook.py")  # see the module docstring


def project_files(repo: Path = REPO) -> list[str]:
    """Files of the project: tracked or new-but-not-ignored (git), else every file but caches."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                             capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (e.g. a handout itself)
        skip = {".git", ".venv", "venv", ".cache", "__pycache__", ".pytest_cache", "handout", "runs"}
        files = [str(p.relative_to(repo)) for p in repo.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(repo).parts)]
    return sorted(f for f in files if (repo / f).is_file() and not f.startswith(LEFT_OUT))


def check_table(repo: Path = REPO) -> None:
    """Every exercise, helper and grading test named in PARTS exists: else a one-line error."""
    for part in PARTS:
        for filename, name in [(f, n) for f, n, _ in part.functions] + list(part.helpers):
            _find(_top_level_functions((repo / filename).read_text(), filename), name, filename)
        for node in part.tests:
            path, _, test = node.partition("::")
            if test not in _test_names((repo / path).read_text(), path):
                raise SystemExit(f"assignment: {path} has no test {test!r} (grades Part {part.number}): "
                                 f"update PARTS in assignment.py")


def _handout_readme(text: str) -> str:
    """The README without its measured results: producing and explaining them is Part 5."""
    m = re.search(r"^## Results\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if not m:
        return text
    return text[:m.start()] + "## Results\n\nYours to measure: see ASSIGNMENT.md, Part 5.\n\n" + text[m.end():]


RESULTS_DOC = "docs/results.md"  # every measured table (not in the README)
RESULTS_STUB = "# Results\n\nYours to measure: see ASSIGNMENT.md, Part 5.\n"


MANIFEST = ".handout.json"  # file -> sha256 of what build wrote: a rebuild replaces only that


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _handout_changes(out: Path) -> list[str]:
    """Files of an earlier handout in `out` that build did not write as they are: changed or new
    (a student's work, answers, notes). Caches and the grader's own gradescope.json do not count."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return [f"{MANIFEST} (missing: built by an older assignment.py)"]
    changes = []
    for p in sorted(out.rglob("*")):
        rel = str(p.relative_to(out))
        if not p.is_file() or rel in (MANIFEST, "gradescope.json") or {"__pycache__", ".pytest_cache"} & set(p.parts):
            continue
        if rel not in manifest:
            changes.append(f"{rel} (new)")
        elif manifest[rel] != _sha(p):
            changes.append(f"{rel} (changed)")
    return changes


def build(out: Path, repo: Path = REPO) -> dict:
    """Write the student version of `repo` into `out`; returns the solution texts of the exercise
    files (file -> source) as read for this build. An earlier handout in `out` is replaced only if
    nothing in it changed since it was built (MANIFEST): a rebuild never deletes a student's work.
    The new handout is written beside it and renamed into place, so a stop leaves one or the other."""
    out, repo = Path(out).resolve(), Path(repo).resolve()
    if out == repo or out in repo.parents:
        raise SystemExit(f"assignment: --out {out} would overwrite the project itself")
    if out.exists() and any(out.iterdir()):
        if not (out / "ASSIGNMENT.md").exists():
            raise SystemExit(f"assignment: {out} exists and is not a handout (no ASSIGNMENT.md): pick another --out")
        changes = _handout_changes(out)
        if changes:
            raise SystemExit(f"assignment: {out} holds work since it was built ({', '.join(changes[:4])}"
                             f"{f' and {len(changes) - 4} more' if len(changes) > 4 else ''}): pick another "
                             "--out, or move it away first")
    check_table(repo)
    solution = {f: (repo / f).read_text() for f in EXERCISE_FILES + DELEGATE_FILES}  # read once: stubs and handout agree
    new = out.with_name(f".{out.name}.building")
    shutil.rmtree(new, ignore_errors=True)  # what a stopped build left
    files = [f for f in project_files(repo) if not (repo / f).resolve().is_relative_to(out)
             and not (repo / f).resolve().is_relative_to(new)]
    for f in files:
        (new / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f, new / f)
    write_exercise_files(new, solution, auto_parts())
    if (new / "README.md").exists():
        (new / "README.md").write_text(_handout_readme((new / "README.md").read_text()))
    if (new / RESULTS_DOC).exists():  # kept as a stub, so the README's link to it resolves
        (new / RESULTS_DOC).write_text(RESULTS_STUB)
    (new / "ASSIGNMENT.md").write_text(handout_text(solution, repo))
    (new / "ANSWERS.md").write_text(answers_template())
    written = sorted(str(p.relative_to(new)) for p in new.rglob("*") if p.is_file())
    (new / MANIFEST).write_text(json.dumps({f: _sha(new / f) for f in written}, indent=0) + "\n")
    if out.exists():
        shutil.rmtree(out)
    new.rename(out)
    return solution


# ----------------------------------------------------------------------------------------------
# The handout (ASSIGNMENT.md) and the answer sheet (ANSWERS.md)
# ----------------------------------------------------------------------------------------------
def _code(block: str, lang: str = "") -> str:
    return f"```{lang}\n{block.rstrip()}\n```\n"


def _pytest_command(part: Part) -> str:
    return "python -m pytest -q \\\n    " + " \\\n    ".join(part.tests)


def points_table(parts=PARTS) -> str:
    """The parts table (markdown): shared by the handout and docs/teaching.md."""
    rows = ["| part | what | paper | you write | points | graded by |", "|---|---|---|---|---|---|"]
    for p in parts:
        names = ", ".join(f"`{f}:{n}`" for f, n, _ in p.functions) or "ANSWERS.md"
        grader = f"{sum(1 for _ in p.tests)} test functions" if p.tests else "hand"
        rows.append(f"| {p.number} | {p.title} | {p.paper} | {names} | {p.points} | {grader} |")
    auto = sum(p.points for p in auto_parts(parts))
    rows.append(f"| | total | | | {sum(p.points for p in parts)} | {auto} by tests, "
                f"{sum(p.points for p in parts) - auto} by hand |")
    return "\n".join(rows) + "\n"


def part_helpers(part: Part, solution: dict) -> list:
    """(file, name) of the given helpers a part's handout shows: the table's, then every private
    top-level function (`_name`) that the reference bodies of the part's functions call. Derived
    from the code, so a helper renamed or added in the solution shows up here by itself."""
    found = list(part.helpers)
    for filename, name, _ in part.functions:
        functions = _top_level_functions(solution[filename], filename)
        for node in ast.walk(functions[name]):
            if (isinstance(node, ast.Name) and node.id.startswith("_") and node.id in functions
                    and (filename, node.id) not in found):
                found.append((filename, node.id))
    lines = {(f, n): _top_level_functions(solution[f], f)[n].lineno for f, n in found}
    return sorted(found, key=lambda h: (h[0], lines[h]))  # in the order the file defines them


def _note(note, solution: dict, part: Part) -> str:
    """A note is a string, or (text, needle): shown only while one of the part's docstrings contains
    the needle, so a note about a docstring's wording cannot outlive it."""
    if isinstance(note, str):
        return note
    text, needle = note
    docs = [_signature_and_docstring(solution[f], n, f) for f, n, _ in part.functions]
    return text if any(needle in d for d in docs) else ""


def handout_text(solution: dict, repo: Path = REPO) -> str:
    """ASSIGNMENT.md: overview, then per part the paper reference, the contracts, the tests to run,
    the points and the written questions."""
    auto = sum(p.points for p in auto_parts())
    total = sum(p.points for p in PARTS)
    s = [textwrap.dedent(f"""\
        # Assignment: CoBA-RL on GRPO, from the reward to the rollout budget

        You will implement the core of **CoBA-RL** (Capability-Oriented Budget Allocation for RL in LLMs,
        [arXiv 2602.03048](https://arxiv.org/abs/2602.03048)) on top of **GRPO** (DeepSeekMath,
        [arXiv 2402.03300](https://arxiv.org/abs/2402.03300), §4.1). Read the paper's §2 first; this handout
        names its sections and equations wherever you need them. The README maps every equation to a file.

        One training step of `train.py` is: allocate B_i rollouts to each of M prompts (**Part 4**, from
        the value of **Part 3**) -> generate -> score each rollout (**Part 1**) -> update the pass rates and
        the failure rate -> GRPO advantages and loss on groups of unequal size (**Part 2**) -> optimizer step.
        The wiring (`train.py`, `engines/rollout.py`, `harness/evaluate.py`), the toy task and model (`toy.py`) and all tests are complete.
        The functions you write raise `NotImplementedError("Part N: ...")` until you do. Some docstrings
        cite `docs/method-sources.md`, which says where each equation and default comes from (the paper,
        the authors' released code, or this project): what you need from it is in the docstrings and below.

        __TABLE__
        Parts 1-4 are graded by the tests listed under each part ({auto} points, partial credit per test
        case); Part 5 by hand ({total - auto} points). The parts are independent: each part's tests call only
        that part's functions, so you can do them in any order and a stuck part costs only its own points.

        ## Setup and rules

        ```bash
        python -m venv .venv && . .venv/bin/activate
        pip install -r requirements.txt     # torch (CPU is enough), transformers, math-verify, ...
        python assignment.py grade .        # your score so far: 0 / {auto} at the start
        ```

        - Keep each function's signature and docstring: the docstring is the contract the tests check.
          Add helpers of your own if you like; use numpy / torch / the standard library only.
        - Do not edit the tests. The grader runs each part in a fresh copy of the project with the original
          tests and your four files; a part whose tests changed while it ran scores 0.
        - Each part's tests run in their own process with a time limit ({DEFAULT_TIMEOUT_S} s; the reference
          takes at most ~10 s) and size limits ({LIMITS.output_kill // 2 ** 20} MB of output, {LIMITS.file_size // 2 ** 20} MB
          per file written, printed output included): an infinite loop costs that part only.
        - `python -m pytest -q` runs the project's whole suite, including end-to-end training tests that
          need all four parts; until then, run the per-part commands below.
        """).replace("__TABLE__\n", points_table() + "\n")]
    for part in PARTS:
        s.append(f"\n## Part {part.number}: {part.title} ({part.points} points"
                 f"{'' if part.tests else ', graded by hand'})\n\n**Reading:** {part.paper}.\n\n{part.about}\n")
        if part.functions:
            s.append("\n### What you write\n")
            for filename, name, _ in part.functions:
                s.append(f"\nIn `{filename}`:\n\n" + _code(_signature_and_docstring(solution[filename], name, filename), "python"))
        helpers = part_helpers(part, solution)
        if helpers:
            s.append("\nGiven, and yours to use:\n\n" + _code("\n".join(
                _signature_and_docstring(solution[f], n, f) for f, n in helpers), "python"))
        notes = [_note(n, solution, part) for n in part.notes]
        if any(notes):
            s.append("\n### What the tests check, beyond the docstrings\n\n" + "".join(f"- {n}\n" for n in notes if n))
        if part.tests:
            s.append(f"\n### Tests ({part.points} points)\n\nThe grader runs exactly these:\n\n"
                     + _code(_pytest_command(part), "bash")
                     + f"\nor `python assignment.py grade . --part {part.number}` for the score.\n")
        if part.questions:
            where = "" if not part.tests else " (answer in ANSWERS.md; graded with Part 5)"
            s.append(f"\n### {'Questions' if not part.tests else 'Written question'}{where}\n\n"
                     + "".join(f"- **Q{q}.** {text}\n" for q, text in part.questions))
    s.append(textwrap.dedent(f"""
        ## When all four parts pass

        ```bash
        python -m pytest -q     # the whole suite (a few minutes; builds the toy model once, ~2 min)
        python train.py         # CoBA-RL on the toy: M = 32 prompts x G = 8 rollouts, 150 steps, ~3 min on CPU
        ```

        `python train.py` prints the held-out greedy accuracy before and after training; with a correct
        implementation it ends clearly above where it started. The JSONL log `runs/default/log.jsonl` has,
        per step, the budgets B_i, pass rates p_i, F_t, alpha_t, beta_t and tau that your functions computed.

        ## Submitting

        Submit `{"`, `".join(EXERCISE_FILES)}` and `ANSWERS.md`. The grader copies them into a clean handout
        and runs `python assignment.py grade`.
        """))
    return "".join(s)


def all_questions() -> list:
    return [(q, text) for part in PARTS for q, text in part.questions]


def answers_template() -> str:
    s = ["# Answers\n\nAnswer each question under its heading, in a few sentences, with numbers where asked.\n"]
    for q, text in all_questions():
        s.append(f"\n## Q{q}\n\n> {text}\n\n{ANSWER_PLACEHOLDER}\n")
    return "".join(s)


def answered(text: str) -> tuple[int, int]:
    """(questions with an answer, questions) in an ANSWERS.md: an answer is anything under the
    heading besides the quoted question and the placeholder."""
    n = 0
    for q, _ in all_questions():
        m = re.search(rf"^## Q{re.escape(q)}\s*\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
        body = "" if not m else "\n".join(l for l in m.group(1).splitlines() if not l.lstrip().startswith(">"))
        n += bool(body.replace(ANSWER_PLACEHOLDER, "").strip())
    return n, len(all_questions())


# ----------------------------------------------------------------------------------------------
# grade: one pytest subprocess per part, in a fresh copy with pristine tests, time and size capped
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What one part's test run may use besides time (a submission printing in a loop
    grew the temp folder at ~320 MB/s). pytest captures the tests' output into a temporary file, so
    the per-file cap is what bounds a print loop; the output cap bounds what reaches the grader."""
    output_keep: int = 256 * 1024        # bytes of pytest's output kept for the report (the end)
    output_kill: int = 16 * 1024 * 1024  # more output than this stops the part
    file_size: int = 256 * 1024 * 1024   # RLIMIT_FSIZE: no file written may grow beyond this
    disk: int = 1024 * 1024 * 1024       # the part's folder (its TMPDIR inside) may hold this much


LIMITS = Limits()


def _junit_results(xml_path: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome in passed/failed/skipped, message) per test case of a JUnit XML report."""
    results = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")  # tests.test_coba -> tests/test_coba.py
        name = f"{module}.py::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or child.text or "").strip()
                break
            if child.tag == "skipped":
                outcome, message = "skipped", (child.get("message") or "").strip()
        results.append((name, outcome, message))
    return results


def stage_part(work: Path, root: Path, tests_from: Path = REPO) -> dict:
    """Lay out one part's grading folder: every project file of `tests_from` (the tests above all,
    fresh for each part: the submission can neither change the copy it is graded by nor break the
    handout for the next one), then the submission's exercise files from `root`. The test files are
    made read-only; returns their fingerprints (inode, ctime, sha256), checked after the run: a write,
    a chmod, a delete or a replace changes one, and no user can set ctime back."""
    missing = [f for f in EXERCISE_FILES if not (root / f).is_file()]
    if missing:
        raise SystemExit(f"assignment: {root} has no {', '.join(missing)}: grade a folder holding the "
                         f"submitted {', '.join(EXERCISE_FILES)}")
    for f in project_files(tests_from):
        if f not in EXERCISE_FILES and not f.startswith(("handout/", "gradescope.json")):
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tests_from / f, work / f)
    for f in EXERCISE_FILES:
        shutil.copy2(root / f, work / f)
    (work / ".tmp").mkdir()
    tests = sorted(p for p in (work / "tests").rglob("*") if p.is_file())
    for p in tests:
        p.chmod(0o444)
    for d in [work / "tests", *(p for p in (work / "tests").rglob("*") if p.is_dir())]:
        d.chmod(0o555)
    return _fingerprints(work, tests)


def _fingerprints(work: Path, files) -> dict:
    out = {}
    for p in files:
        try:
            st = p.stat()
            out[str(p.relative_to(work))] = (st.st_ino, st.st_ctime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        except OSError:
            out[str(p.relative_to(work))] = None
    return out


def _unprotect(work: Path) -> None:
    """Undo stage_part's read-only bits so the folder can be deleted."""
    for d in [work, *(p for p in work.rglob("*") if p.is_dir() and not p.is_symlink())]:
        try:
            d.chmod(0o755)
        except OSError:
            pass


def _limit_files(size: int):
    """preexec_fn: the child (pytest and all it starts) can write no file beyond `size` bytes."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def _folder_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _run_capped(cmd, cwd: Path, env: dict, timeout: float, limits: Limits) -> dict:
    """Run `cmd` in its own session; stream its output through a pipe, keeping the last
    limits.output_keep bytes; stop it (the whole session) on timeout, on more output than
    limits.output_kill, or when its folder grows beyond limits.disk. Returns output and why it stopped."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_limit_files(limits.file_size))
    fd, kept, total, stopped = proc.stdout.fileno(), bytearray(), 0, None
    deadline, next_du = time.monotonic() + timeout, time.monotonic() + 1.0
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                stopped = "timeout"
                break
            if now >= next_du:
                next_du = now + 1.0
                if _folder_bytes(cwd) > limits.disk:
                    stopped = "disk"
                    break
            ready, _, _ = select.select([fd], [], [], min(deadline - now, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:  # every writer closed: pytest ended
                break
            total += len(chunk)
            kept += chunk
            del kept[:-limits.output_keep]
            if total > limits.output_kill:
                stopped = "output"
                break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it started, too (also after a normal end)
        except ProcessLookupError:
            pass
        proc.stdout.close()
        proc.wait()
    return {"output": kept.decode(errors="replace"), "bytes": total, "stopped": stopped,
            "returncode": proc.returncode}


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:g} MB"


def run_part(root: Path, part: Part, timeout: float = DEFAULT_TIMEOUT_S, limits: Limits = LIMITS,
             tests_from: Path = REPO) -> dict:
    """Run one part's tests on the submission in `root` in a fresh interpreter, in a fresh folder
    (stage_part: pristine tests from `tests_from`); returns passed/run counts and a report.

    The subprocess gets its own session so that stopping it stops whatever it started too. Bytecode
    caching is off: a stub and its solution written into the same file within a second would
    otherwise share a stale .pyc (the check writes both)."""
    root, tests_from = Path(root).resolve(), Path(tests_from).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work, xml_path = Path(tmp) / "part", Path(tmp) / "report.xml"
        work.mkdir()
        try:
            before = stage_part(work, root, tests_from)
            cmd = [sys.executable, "-m", "pytest", "-v", "--tb=line", "--show-capture=no", "-p", "no:cacheprovider",
                   f"--rootdir={work}", f"--confcutdir={work}", f"--junitxml={xml_path}", *part.tests]
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                   "TMPDIR": str(work / ".tmp"), "PWD": str(work)}
            t0 = time.perf_counter()
            ran = _run_capped(cmd, work, env, timeout, limits)
            seconds = time.perf_counter() - t0
            after = _fingerprints(work, [work / f for f in before])
            changed = sorted(f for f in before if after[f] != before[f])
            xml_path_existed = xml_path.exists()
            results = _junit_results(xml_path) if xml_path_existed and not ran["stopped"] and not changed else []
        finally:
            _unprotect(work)
    output = ran["output"]
    passed = sum(outcome == "passed" for _, outcome, _ in results)
    if changed:
        report = (f"the submission changed the grading tests ({', '.join(changed[:3])}): 0 points for this part. "
                  "Do not touch the tests: the grader runs a fresh copy of them")
    elif ran["stopped"] == "timeout":
        running = [l for l in output.splitlines() if "::" in l]
        report = (f"timed out after {timeout:.0f} s: 0 points for this part. Last test started: "
                  f"{running[-1].split()[0] if running else '(none)'}")
    elif ran["stopped"] == "output":
        report = (f"stopped: printed more than {_mb(limits.output_kill)} of output: 0 points for this part. "
                  "The end of it:\n" + "\n".join(output.splitlines()[-5:])[-1000:])
    elif ran["stopped"] == "disk":
        report = f"stopped: wrote more than {_mb(limits.disk)} of files: 0 points for this part"
    elif not results:  # killed (os._exit, a segfault) before its report, or no test collected
        what = "ran no test" if xml_path_existed else "stopped without a report"
        report = (f"pytest {what} (exit code {ran['returncode']}): 0 points for this part.\n"
                  + "\n".join(output.splitlines()[-15:]))
    else:
        failed = [f"FAILED {name}: {msg.splitlines()[0][:200] if msg else ''}"
                  for name, outcome, msg in results if outcome != "passed"]
        more = [f"... and {len(failed) - 10} more"] if len(failed) > 10 else []
        big = [f"(files are capped at {_mb(limits.file_size)} each, captured output included)"] \
            if any("File too large" in msg for _, _, msg in results) else []
        report = "\n".join([f"{passed}/{len(results)} tests passed", *failed[:10], *more, *big])
    return {"part": part.number, "passed": passed, "run": len(results), "timed_out": ran["stopped"] == "timeout",
            "stopped": ran["stopped"] or ("tests changed" if changed else None),
            "seconds": round(seconds, 1), "report": report}


def grade(root: Path, parts=None, timeout=DEFAULT_TIMEOUT_S, quiet: bool = False, limits: Limits = LIMITS,
          tests_from: Path = REPO) -> list[dict]:
    """Score each auto-graded part of the submission in `root` (all, or the numbers in `parts`);
    returns one dict per part (score, max_score, report). timeout: seconds per part, or {part number:
    seconds} with DEFAULT_TIMEOUT_S for the parts it does not name. Each part runs on a fresh copy
    of `tests_from`'s project (tests included) with `root`'s exercise files: `root` is only read."""
    root = Path(root).resolve()
    chosen = [p for p in auto_parts() if parts is None or p.number in parts]
    rows = []
    for part in chosen:
        seconds = timeout.get(part.number, DEFAULT_TIMEOUT_S) if isinstance(timeout, dict) else timeout
        r = run_part(root, part, seconds, limits, tests_from)
        r.update(title=part.title, max_score=part.points,
                 score=round(part.points * r["passed"] / r["run"], 2) if r["run"] else 0.0)
        rows.append(r)
        if not quiet:
            print(f"  Part {part.number} {part.title}: {r['score']:g} / {part.points}  "
                  f"({r['passed']}/{r['run']} tests, {r['seconds']:.0f} s"
                  f"{', ' + r['stopped'].upper() if r['stopped'] else ''})", flush=True)
    return rows


def hand_graded_status(root: Path) -> str:
    answers = Path(root) / "ANSWERS.md"
    if not answers.exists():
        return "ANSWERS.md missing"
    n, total = answered(answers.read_text())
    return f"ANSWERS.md: {n} of {total} questions answered"


def score_table(rows: list[dict], root: Path) -> str:
    lines = [f"{'part':<5} {'what':<44} {'tests':>9} {'points':>15}"]
    for r in rows:
        lines.append(f"{r['part']:<5} {r['title'][:44]:<44} {r['passed']:>4}/{r['run']:<4} "
                     f"{r['score']:>8.2f} / {r['max_score']:<4}")
    for part in PARTS:
        if not part.tests:
            lines.append(f"{part.number:<5} {part.title[:44]:<44} {'by hand':>9} {'- / ' + str(part.points):>15}")
    got, most = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
    lines.append(f"{'':<5} {'total (by tests)':<44} {'':>9} {got:>8.2f} / {most:<4}")
    lines.append(f"{'':<5} {hand_graded_status(root)}")
    return "\n".join(lines)


def gradescope_json(rows: list[dict], root: Path, seconds: float) -> dict:
    """Gradescope's autograder format (results.json): one test entry per auto-graded part."""
    hand = [p for p in PARTS if not p.tests]
    note = "; ".join(f"Part {p.number} ({p.title}, {p.points} points) is graded by hand" for p in hand)
    return {"score": round(sum(r["score"] for r in rows), 2), "execution_time": round(seconds, 1),
            "output": f"{note}. {hand_graded_status(root)}.", "visibility": "visible",
            "tests": [{"name": f"Part {r['part']}: {r['title']}", "number": str(r["part"]), "score": r["score"],
                       "max_score": r["max_score"], "output": r["report"]} for r in rows]}


# ----------------------------------------------------------------------------------------------
# check: the isolation property, on a fresh build
# ----------------------------------------------------------------------------------------------
def check(repo: Path = REPO, quiet: bool = False) -> list[str]:
    """Build a handout and grade it in the configurations below; returns the violations, [] when
    the grading is sound. A part whose tests pass on its stub grades nothing; one whose tests need
    another part cannot be graded alone.

        every part a stub                       every part scores 0
        part j alone restored (each j)          part j scores full
        every part restored but j (each j)      part j scores 0
        the untouched solution                  every part scores full

    Rows 2 and 3 cover every mix of finished and unfinished parts, since finishing a function never
    makes a test fail: a test of part j passes once j is done, whatever else is, and fails while j
    is not, whatever else is. In particular, with only part k restored, no other part moves.

    Each part's tests run in a subprocess, as `grade` runs them. Most of the time is the torch
    import of each run, so a part is run again only when the exercise files its tests can import
    (`imported_files`) differ from a configuration already graded: Part 2 (grpo.py only) runs twice,
    not four times."""
    problems, results, runs = [], {}, 0
    parts = auto_parts()
    everything = {p.number for p in parts}
    configs = [("stubs", set(), everything)]
    configs += [(f"only part {j} restored", {j}, {j}) for j in sorted(everything)]
    configs += [(f"all but part {j} restored", everything - {j}, {j}) for j in sorted(everything)]
    configs += [("solution", everything, everything)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "handout"
        solution = build(root, repo)
        sees = {p.number: sorted(imported_files(root, p) & set(EXERCISE_FILES)) for p in parts}
        for name, restored, graded in configs:
            written = write_exercise_files(root, solution, [p for p in parts if p.number not in restored])
            if not quiet:
                print(f"{name}:", flush=True)
            rows = []
            for j in sorted(graded):
                # A part's tests see only the exercise files they import: an identical set of
                # those files was graded already if the key is known, with the same outcome.
                key = (j, tuple(written[f] for f in sees[j]))
                if key not in results:
                    results[key], runs = grade(root, parts={j}, quiet=quiet, tests_from=repo)[0], runs + 1
                elif not quiet:
                    print(f"  Part {j}: same files as an earlier configuration ({', '.join(sees[j])})")
                rows.append(results[key])
            for r in rows:
                want_full = r["part"] in restored
                ok = r["run"] > 0 and r["passed"] == r["run"] if want_full else r["passed"] == 0
                if not ok:
                    problems.append(f"{name}: Part {r['part']} passed {r['passed']}/{r['run']} tests, expected "
                                    f"{'all' if want_full else 'none'}:\n{r['report']}")
    if not quiet:
        print(f"{len(configs)} configurations, {sum(len(g) for _, _, g in configs)} part gradings, {runs} pytest runs")
    return problems


def imported_files(root: Path, part: Part) -> set:
    """Project files a part's test run can import: its test files and tests/conftest.py, then,
    transitively, every project module named in an `import` anywhere in their code (inside functions
    too) or in a string (pytest.importorskip("coba")). Conservative: a name in a string that is
    never imported only adds a file, and so only costs a run."""
    modules = {p.stem: p.name for p in root.glob("*.py")}
    todo = ["tests/conftest.py"] + sorted({node.partition("::")[0] for node in part.tests})
    seen = set()
    while todo:
        f = todo.pop()
        if f in seen or not (root / f).exists():
            continue
        seen.add(f)
        for node in ast.walk(ast.parse((root / f).read_text(), filename=f)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]
            else:
                continue
            todo += [modules[n.split(".")[0]] for n in names if n.split(".")[0] in modules]
    return seen


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Course assignment mode: build the student handout, grade it.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the student version of the project and ASSIGNMENT.md")
    b.add_argument("--out", default="handout", help="output folder (replaces an earlier handout only if nothing in it changed)")
    g = sub.add_parser("grade", help="run each part's tests, print the score table, write Gradescope JSON")
    g.add_argument("dir", nargs="?", default=".", help="the handout (or submission) to grade")
    g.add_argument("--part", type=int, action="append", help="grade only this part (repeatable)")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per part")
    g.add_argument("--json", default=None, help="results file (Gradescope: /autograder/results/results.json; "
                                                "default DIR/gradescope.json)")
    sub.add_parser("check", help="isolation check: each part 0 on its stub, full alone, no effect on others")
    args = ap.parse_args(argv)

    # every path flag is checked before anything is built or graded (harness/paths.py): '' is not "here"
    if args.command == "build":
        out = check_path("--out", args.out, "dir")
        build(out)
        n = sum(len(p.functions) for p in auto_parts())
        print(f"wrote {out}/: {n} functions stubbed in {', '.join(EXERCISE_FILES)}; ASSIGNMENT.md, ANSWERS.md\n"
              f"next: python assignment.py grade {out}")
        return 0
    if args.command == "grade":
        root = check_path("DIR", args.dir, "dir", exists=True)
        # the default too: DIR/gradescope.json may be a folder; --json '' is an error, not the default
        json_path = check_path("--json", str(root / "gradescope.json") if args.json is None else args.json, "file")
        check_path("--json's folder", str(json_path.parent), "dir")
        t0 = time.perf_counter()
        print(f"grading {root.resolve()}", flush=True)
        rows = grade(root, parts=set(args.part) if args.part else None, timeout=args.timeout)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = json_path.with_name(f".{json_path.name}.tmp{os.getpid()}")  # whole or not at all
        tmp.write_text(json.dumps(gradescope_json(rows, root, time.perf_counter() - t0), indent=2) + "\n")
        os.replace(tmp, json_path)
        print("\n" + score_table(rows, root) + f"\nwrote {json_path}")
        return 0
    t0 = time.perf_counter()
    problems = check()
    print("\n".join(problems) if problems else "isolation check passed: each part scores 0 on its stub, full "
          f"with only its own functions, and never moves another part ({time.perf_counter() - t0:.0f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
