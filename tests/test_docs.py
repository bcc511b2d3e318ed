"""The README and docs/*.md stay true (issue 31): links resolve, shown commands parse, the front door
stays short.

- Every relative link and image in README.md and docs/*.md names a file that exists, and a
  `#anchor` names a heading of the target (GitHub's slugs: lower case, punctuation dropped, spaces
  to hyphens).
- Every `python X.py ...` command they show, in a code block or in inline code, parses with X.py's
  own argparse parser: a flag that does not exist, or a misspelt subcommand, fails here. Flags are
  matched whole (argparse would accept `--step` for `--steps`; a document should not).
- README.md's set-up and test commands are the ones .ci/run runs; README.md stays under 250 lines.

No training: each script's parser is built and run, and main() is stopped right after parsing.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250  # issue 31: the front door fits in one reading (nanoGPT's is ~230)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ----------------------------------------------------------------------------------------------
# Links
# ----------------------------------------------------------------------------------------------
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return out


def left_out_of_handout(root: Path, target: Path) -> bool:
    """In a student handout (assignment.py build), results/ is left out on purpose: links into it
    are not broken there. Everywhere else every link must resolve."""
    import assignment

    if not (root / assignment.MANIFEST).exists():
        return False
    rel = target.resolve().relative_to(root.resolve()).as_posix()
    return any(rel.startswith(p) or rel + "/" == p for p in assignment.LEFT_OUT)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """`file: target (why)` for each relative link of a markdown file that does not resolve."""
    bad = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part) if file_part else path
        if not dest.exists():
            if not left_out_of_handout(root, dest):
                bad.append(f"{path.name}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target} (no heading #{anchor} in {dest.name})")
    return bad


def test_every_relative_link_resolves():
    bad = [b for doc in documents() for b in broken_links(doc)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Two words\n")
    doc = tmp_path / "README.md"
    doc.write_text("[ok](docs/a.md#two-words) [ok](docs/a.md) [web](https://x.org/y) ![gone](docs/gone.png)\n"
                   "[bad anchor](docs/a.md#three-words)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(doc, tmp_path) == ["README.md: docs/gone.png (no such file)",
                                           "README.md: docs/a.md#three-words (no heading #three-words in a.md)"]


def test_slugs_follow_github():
    assert slug("Speed of a step (`python bench.py step`)") == "speed-of-a-step-python-benchpy-step"
    assert slug("Lab `toy-strong`: both phases") == "lab-toy-strong-both-phases"


# ----------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------
INLINE = re.compile(r"`([^`]+)`")  # may wrap onto the next line, like the prose
PYTHON = re.compile(r"(^|/)python3?$")  # python, python3, .venv-vllm/bin/python
SEPARATORS = {"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "2>&1"}


def shell_commands(text: str) -> list[str]:
    """Candidate command lines: each code block line (backslash continuations joined) and each
    inline code span, in the order they appear."""
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        out += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    out += [span.replace("\n", " ") for span in INLINE.findall(FENCE.sub("", text)) if "\n\n" not in span]
    return out


def script_calls(line: str) -> list[tuple[str, list[str]]]:
    """(script, argv) for each `python X.py ARGS` in one shell line, up to the next && ; | or >."""
    try:
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: prose in backticks, not a command
        return []
    calls = []
    for i, tok in enumerate(tokens[:-1]):
        at = i + 1 if PYTHON.search(tok) else None
        if tok == "torchrun":  # `torchrun LAUNCHER-FLAGS X.py ARGS` (docs/distributed.md): X.py's ARGS
            at = next((j for j in range(i + 1, len(tokens)) if tokens[j].endswith(".py") or tokens[j] in SEPARATORS),
                      None)
        if at is not None and at < len(tokens) and tokens[at].endswith(".py") and "/" not in tokens[at]:
            argv = []
            for t in tokens[at + 1:]:
                if t in SEPARATORS:
                    break
                argv.append(t)
            calls.append((tokens[at], argv))
    return calls


class Parsed(Exception):
    """Raised right after a script's parser accepted argv: nothing else of main() runs."""


def parse_with_script(script: str, argv: list[str], monkeypatch) -> None:
    """Parse argv with the script's own parser; SystemExit (argparse's error) if it refuses."""
    name = script[:-3]
    if name == "train":  # its parser lives in harness/cli.py; main() would train
        from harness import cli

        cli.build_parser().parse_args(argv)
        return
    if name == "compare":  # its own flags, then the rest go to train.py's parser
        from harness import cli
        import compare

        _, train_flags = compare.parse_args(argv)
        cli.build_parser().parse_args(train_flags)
        return
    module = importlib.import_module(name)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    with monkeypatch.context() as m, pytest.raises(Parsed):  # undone before the next script
        m.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        m.setattr(sys, "argv", [script, *argv])  # a main() that reads sys.argv (toy.py)
        if inspect.signature(module.main).parameters:
            module.main(argv)
        else:
            module.main()


@pytest.fixture
def whole_flags_only(monkeypatch):
    """argparse accepts a unique prefix (`--step` for `--steps`); a document must spell flags out."""
    monkeypatch.setattr(argparse.ArgumentParser, "_get_option_tuples", lambda self, option_string: [])


def shown_calls(root: Path = ROOT) -> list[tuple[str, str, list[str]]]:
    return [(doc.name, script, argv) for doc in documents(root) for line in shell_commands(doc.read_text())
            for script, argv in script_calls(line) if (root / script).exists()]


def refused(calls, monkeypatch, capsys) -> list[str]:
    bad = []
    for doc, script, argv in calls:
        try:
            parse_with_script(script, argv, monkeypatch)
        except SystemExit as e:
            if e.code in (0, None):  # --help: shown on purpose, printed and left
                continue
            why = capsys.readouterr().err.strip().splitlines()
            bad.append(f"{doc}: python {script} {shlex.join(argv)}: {why[-1] if why else e}")
    return bad


def test_every_shown_command_parses(whole_flags_only, monkeypatch, capsys):
    calls = shown_calls()
    # the extraction finds them (compare.py's commands live in docs/results.md, a stub in a handout)
    assert {s for _, s, _ in calls} >= {"train.py", "bench.py", "plots.py", "assignment.py", "gpu_check.py"}
    bad = refused(calls, monkeypatch, capsys)
    assert not bad, "commands their script refuses:\n" + "\n".join(bad)


def test_an_unknown_flag_or_subcommand_is_caught(whole_flags_only, monkeypatch, capsys):
    text = ("```bash\npython train.py --steps 5 --no-such-flag 3   # a comment\n"
            "python bench.py stepp\n```\n"
            "and `python compare.py --preset headline --model toy-strong --learning-rat 1e-5` inline, "
            "`python train.py --step 5` (a prefix), `python plots.py --method-figure x.png` (fine)\n")
    calls = [("X.md", s, a) for line in shell_commands(text) for s, a in script_calls(line)]
    assert [c[1] for c in calls] == ["train.py", "bench.py", "compare.py", "train.py", "plots.py"]
    bad = refused(calls, monkeypatch, capsys)
    assert len(bad) == 4 and "--no-such-flag" in bad[0] and "stepp" in bad[1]
    assert "--learning-rat" in bad[2] and "--step" in bad[3]


def test_a_torchrun_launch_is_checked_like_python():
    """torchrun's own flags (before X.py) are the launcher's; the ones after are X.py's (issue 35)."""
    line = "torchrun --nnodes 2 --nproc_per_node 8 --rdzv_id x train.py --steps 5 --no-such-flag && ls"
    assert script_calls(line) == [("train.py", ["--steps", "5", "--no-such-flag"])]
    assert script_calls("torchrun --standalone && python bench.py dist") == [("bench.py", ["dist"])]


# ----------------------------------------------------------------------------------------------
# The front door
# ----------------------------------------------------------------------------------------------
def test_readme_stays_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (budget {README_MAX_LINES}): move detail to docs/"


def test_readme_setup_and_test_commands_are_the_ones_ci_runs():
    """The quick start's set-up and test commands appear in .ci/run (pip's -q aside)."""
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Reading order")]
    shown = [line.split("#")[0].strip() for block in re.findall(r"^```bash\n(.*?)^```", quick, re.S | re.M)
             for line in block.splitlines()]
    steps = [part.strip() for line in shown for part in line.split("&&") if part.strip()]
    needed = [s for s in steps if s.startswith(("python3 -m venv", ". .venv", "pip install", "python -m pytest"))]
    assert len(needed) >= 4, steps
    for s in needed:
        assert s in ci, f"README's `{s}` is not what .ci/run runs"


def test_the_readme_picture_is_drawn_by_plots(tmp_path):
    """README's figure comes from `python plots.py --method-figure PATH` (coba.py alone, no run)."""
    import plots
    from matplotlib.image import imread

    ours = imread(plots.method_figure(tmp_path / "beta.png"))  # (H, W, 4)
    committed = imread(ROOT / "docs" / "beta_by_failure_rate.png")
    assert ours.shape == committed.shape and ours[..., :3].std() > 0.05  # same canvas, not blank
    assert "docs/beta_by_failure_rate.png" in (ROOT / "README.md").read_text()


# ----------------------------------------------------------------------------------------------
# The project cites only itself (issue 41.7)
# ----------------------------------------------------------------------------------------------
OUTSIDE = "../" + "shared/"  # the maintainers' notes beside the repository, which no user has (split: not a hit here)


def tracked_files() -> list[Path]:
    """The repository's files as git lists them; without git metadata (an exported tree), every file
    outside the ignored places (dot folders, runs/, caches), so the check below still runs."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [ROOT / f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        skip = {"runs", "mutants", "handout", "__pycache__"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not any(
            part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)]


def test_no_file_cites_notes_outside_the_repository():
    """A user has only the repository: no file may send them to OUTSIDE or to the notes' old
    names, and every `method-sources.md §N` a file cites is a section of docs/method-sources.md."""
    files = tracked_files()
    assert len(files) > 50 and ROOT / "README.md" in files
    texts = {f: f.read_bytes().decode("utf-8", "ignore") for f in files if f.is_file()}
    outside = [f"{f.relative_to(ROOT)}:{n}" for f, t in texts.items()
               for n, line in enumerate(t.splitlines(), 1) if OUTSIDE in line]
    assert not outside, f"cites {OUTSIDE}: {outside}"
    old = [f"{f.relative_to(ROOT)}:{n}" for f, t in texts.items()
           for n, line in enumerate(t.splitlines(), 1) if re.search(r"(?<![\w/-])method\.md", line)]
    assert not old, f"cites the old name of docs/method-sources.md: {old}"
    sections = set(re.findall(r"^## §(\d+)\.", (ROOT / "docs" / "method-sources.md").read_text(), re.M))
    cited = {m for t in texts.values() for m in re.findall(r"method-sources\.md §(\d+)", t)}
    assert cited and cited <= sections, f"cited sections {sorted(cited - sections)} are not in docs/method-sources.md"

