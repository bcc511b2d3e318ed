"""The project's shape: the paper on top, the machinery beneath, no file importing one above it,
and a train.py that reads like the paper's loop (no function over ~60 lines).

The root holds the paper's files (coba.py, allocate.py, grpo.py, verify.py, train.py) and the
scripts users run by name (compare, plots, bench, gpu_check, toy, assignment); everything else lives
in a folder that says what it holds: engines/ (generation, LoRA, torchrun, checkpoints, tracking),
arms/ (the baselines and diagnostics beside the paper's arm), harness/ (flags, data, models,
evaluation, statistics, sweeps, paths), speedups/ (exact speed-ups, each beside the plain
computation it accelerates). A cycle (even through an import inside a function) means
two files each need the other to be read first."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engines", "arms", "harness", "speedups")
PAPER = ("coba", "allocate", "grpo", "verify", "train")
SCRIPTS = ("compare", "plots", "bench", "gpu_check", "toy", "assignment")
MODULES = {p.stem: p for p in ROOT.glob("*.py")} | {
    p.stem: p for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py") if p.stem != "__init__"}


def project_imports(path: Path) -> set[str]:
    """Project modules a file imports anywhere in it (top level or inside a function); a module of
    a package counts under its own name (`from engines import rollout`, `engines.rollout`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[-1] if a.name.split(".")[0] in PACKAGES else a.name.split(".")[0]
                      for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] in PACKAGES:
                found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
            else:
                found.add(parts[0])
    return (found & MODULES.keys()) - {path.stem}


def test_the_root_shows_the_paper_and_the_scripts_users_run():
    assert {p.stem for p in ROOT.glob("*.py")} == set(PAPER) | set(SCRIPTS)
    for pkg in PACKAGES:
        assert (ROOT / pkg / "__init__.py").is_file(), pkg


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the import graph as a path [a, b, ..., a], or None (depth-first, three colours)."""
    colour, stack = {m: 0 for m in graph}, []

    def visit(m):
        colour[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if colour[n] == 1:
                return stack[stack.index(n):] + [n]
            if colour[n] == 0 and (c := visit(n)):
                return c
        colour[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if colour[m] == 0 and (c := visit(m)):
            return c
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_file_imports_one_above_it():
    graph = {m: project_imports(p) for m, p in MODULES.items()}
    assert graph["train"] >= {"coba", "allocators", "grpo", "verify", "data", "checkpoint", "rollout"}  # parsed
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"
    assert graph["paths"] == set(), "harness/paths.py is every script's path check: it imports nothing of ours"
    for pure in ("dynamic_sampling", "stats", "sweep"):  # pure helpers: tests drive them without a model
        assert graph[pure] == set(), pure
    assert graph["grpo"] == set(), "grpo.py is the paper alone: the update at scale imports it, not the reverse"
    assert graph["allocate"] == set(), "allocate.py is the paper alone: the arms and speed-ups import it, not the reverse"
    assert graph["coba"] == set(), "coba.py is the paper alone: Knapsack-RL's statistics are recorded beside its tracker"
    assert graph["verify"] == {"grading"}, "verify.py's one engine is its timeout pool (engines/grading.py)"
    for low in ("coba", "allocate", "grpo", "verify", "toy", "data", "models", "checkpoint", "dist", "lora",
                "update", "sampler_correction", "shared_prompt", "grouped_kv", "top_p",
                "allocators", "knapsack", "released", "lazy_heap", "threshold",
                "dynamic_sampling", "cli", "evaluate", "stats", "sweep"):
        assert "train" not in graph[low] and "compare" not in graph[low], low


def test_train_py_functions_read_in_one_screen():
    tree = ast.parse((ROOT / "train.py").read_text())
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60}
    assert not long, f"train.py functions over 60 lines: {long}"
    assert "def rl_step" in (ROOT / "train.py").read_text()


# What names an arm: its flags' words (DAPO's --dynamic-sampling, Knapsack-RL's --allocator knapsack,
# MoPPS's --prompt-selection, our --probe, the --pass-rate-source oracle diagnostic)
ARM_WORDS = ("dapo", "dynamic_sampling", "knapsack", "mopps", "prompt_selection", "probe", "oracle",
             "pass_rate_source")


def arm_mentions(nodes) -> list[str]:
    """Where these functions or classes name an arm in code (docstrings and comments may explain):
    an identifier, attribute, argument or keyword containing an arm's word, a string that is not a
    docstring containing one (a log key, `args.allocator == "knapsack"`), or a getattr with a default
    or hasattr (asking an object whether it is some arm's)."""
    found = []
    for top in nodes:
        docs = {id(n.body[0].value) for n in ast.walk(top) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(top):
            words = {ast.Name: lambda: [n.id], ast.Attribute: lambda: [n.attr], ast.arg: lambda: [n.arg],
                     ast.keyword: lambda: [n.arg or ""], ast.FunctionDef: lambda: [n.name],
                     ast.ClassDef: lambda: [n.name], ast.alias: lambda: [n.name, n.asname or ""],
                     ast.Constant: lambda: [n.value] if isinstance(n.value, str) and id(n) not in docs else []}
            for w in words.get(type(n), list)():
                if any(a in w.lower() for a in ARM_WORDS):
                    found.append(f"line {n.lineno}: {w!r}")
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and (
                    n.func.id == "hasattr" or (n.func.id == "getattr" and len(n.args) > 2)):
                found.append(f"line {n.lineno}: {n.func.id}(...)")
    return found


def test_the_paper_loop_has_no_arm_branch():
    """README 'Reading order' 5: rl_step has no arm branch, an arm replaces one of steps 1-4
    (arms/steps.py). rl_step, PaperStep and every train.py function they call, and what the step
    hands on (engines/step_data.py), name no arm: DAPO's spending is its own StepBatch (DapoBatch),
    Knapsack-RL's estimate its own step 2 (KnapsackRates), MoPPS's draws its sampler's log_fields()."""
    tree = ast.parse((ROOT / "train.py").read_text())
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    reached, todo = {}, ["rl_step", "PaperStep"]
    while todo:  # the loop and the train.py functions it reaches
        name = todo.pop()
        if name in top and name not in reached:
            reached[name] = top[name]
            todo += [n.id for n in ast.walk(top[name]) if isinstance(n, ast.Name)]
    assert {"rl_step", "PaperStep", "allocate_step", "sample_and_reward", "learn"} <= reached.keys()
    assert not arm_mentions(reached.values()), f"train.py's loop names an arm: {arm_mentions(reached.values())}"
    step_data = [ast.parse((ROOT / "engines" / "step_data.py").read_text())]
    assert not arm_mentions(step_data), f"engines/step_data.py names an arm: {arm_mentions(step_data)}"
    # the check sees the branches it is there for
    assert arm_mentions([ast.parse('def f(run, got):\n    """DAPO"""\n    x = got.dapo\n'
                                   '    getattr(run.sampler, "last_draws", None)\n    return {"mopps_theta": x}')]) \
        == ["line 3: 'dapo'", "line 4: getattr(...)", "line 5: 'mopps_theta'"]
