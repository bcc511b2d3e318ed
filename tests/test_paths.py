"""Issue 32: a redraw changes nothing committed, and no empty path is taken for a place.
Run: python -m pytest -q tests/test_paths.py   (a few seconds; no training run finishes)

1. `compare.py --plots-only` on a copy of each committed results folder leaves runs.jsonl,
   compare.jsonl and table.md byte-identical (it used to rewrite compare.jsonl's first line with the
   redraw's own argv), and says so; a table the code draws differently is reported, not silent.
   PNGs carry no matplotlib version. The figures themselves are not compared here: their pixels
   depend on matplotlib's and FreeType's release, so this test draws none (plot_comparison stubbed).
2. Every flag that names a file or folder (harness/paths.py): empty or blank, a file where a folder is
   expected and the reverse, a symlinked run file in OUTPUT_DIR: one line `error: --x ...` naming
   the fix, and nothing written (the current directory stays empty).
"""
import os
import shutil
import sys
from pathlib import Path

import pytest

import assignment
import compare
import gpu_check
from harness import paths
import plots
import toy
import train

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "toy", "--prompts-per-step", "8", "--num-generations", "4", "--train-size", "32", "--eval-size", "16",
         "--eval-every", "0", "--no-progress", "--max-budget", "12", "--steps", "1"]
RESULTS = ("runs.jsonl", "compare.jsonl", "table.md")  # a results folder's tables (compare.RESULTS_FILES)
# every results folder committed under results/, found by walking it (a folder with any of the files)
COMMITTED = sorted({p.parent.relative_to(ROOT) for name in RESULTS for p in (ROOT / "results").rglob(name)})


def refusal(call, *args) -> str:
    """The one line a command stops with (SystemExit's message), checked to be one line."""
    with pytest.raises(SystemExit) as exc:
        call(*args)
    line = str(exc.value.code)
    assert line.startswith("error: ") and "\n" not in line, line
    return line


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty current directory: whatever a command writes 'here' shows up in it."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return here


# ---------------------------------------------------------------------------------------------
# 1. A redraw reproduces the committed tables byte for byte
# ---------------------------------------------------------------------------------------------
def redraw_commands(table_dir: Path, out: Path) -> dict[str, list[str]]:
    """The --plots-only commands a user would type to redraw a results folder (`out` in place of the
    --out it was made with): the plain one (its preset and model; its seeds where not the preset's),
    the sweep's own recorded command, and the table's arms named in reverse order. All three must
    redraw it byte for byte: a redraw keeps the committed table's arm order, whatever --arms says."""
    rows = compare.read_jsonl(table_dir / "compare.jsonl")
    config, arms = rows[0], [r["arm"] for r in rows if r.get("type") == "summary"]
    plain = ["--plots-only", "--preset", config["preset"], "--model", config["model"], "--out", str(out)]
    if config["seeds"] != compare.PRESETS[config["preset"]]["seeds"]:
        plain += ["--seeds", *map(str, config["seeds"])]
    argv = list(config["argv"])
    argv[argv.index("--out") + 1:argv.index("--out") + 2] = [str(out)]  # every committed sweep names its --out
    return {"plain": plain, "recorded": ["--plots-only", *argv], "arms reversed": plain + ["--arms", *arms[::-1]]}


@pytest.mark.parametrize("folder", COMMITTED, ids=str)
def test_plots_only_on_a_committed_results_folder_changes_no_byte(folder, tmp_path, monkeypatch, capsys):
    assert COMMITTED, "no committed results folder (runs.jsonl, compare.jsonl, table.md) found"
    assert all((ROOT / folder / n).is_file() for n in RESULTS), f"{folder} lacks one of {RESULTS}"
    table_dir = tmp_path / folder
    shutil.copytree(ROOT / folder, table_dir, ignore=shutil.ignore_patterns("*.png"))
    committed = {n: (ROOT / folder / n).read_bytes() for n in RESULTS}
    monkeypatch.setattr(compare, "plot_comparison", lambda *a, **k: [])  # figures: see the docstring
    for name, argv in redraw_commands(table_dir, table_dir.parent).items():
        compare.main(argv)
        assert {n: (table_dir / n).read_bytes() for n in RESULTS} == committed, name
        assert f"runs.jsonl, compare.jsonl, table.md in {table_dir} byte-identical to before" in capsys.readouterr().out
    # a table that this code draws otherwise than the committed one is rewritten, and said so
    (table_dir / "table.md").write_bytes(committed["table.md"] + b"a line from older code\n")
    compare.main(redraw_commands(table_dir, table_dir.parent)["plain"])
    assert f"redraw: table.md in {table_dir} changed" in capsys.readouterr().out
    assert (table_dir / "table.md").read_bytes() == committed["table.md"]


def test_pngs_carry_no_matplotlib_version(tmp_path):
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    png = plots._save(fig, tmp_path / "a.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in png and b"Matplotlib" not in png


# ---------------------------------------------------------------------------------------------
# 2. Path flags: empty, blank, file for folder and folder for file, symlinked run files
# ---------------------------------------------------------------------------------------------
def test_empty_or_blank_output_dir_is_refused_and_nothing_written_here(cwd):
    for value in ("", " "):  # Path("") is ".": the run used to go into the current directory, exit 0
        line = refusal(train.main, SMALL + ["--output-dir", value])
        assert line == f"error: --output-dir {value!r} is empty: pass a folder (an unset shell variable?)"
    assert list(cwd.iterdir()) == []


def test_train_py_path_flags_file_for_folder_and_back(cwd):
    afile, adir = cwd.parent / "afile", cwd.parent / "adir"
    (cwd.parent / "data.jsonl").mkdir()  # a folder with a data file's name
    # each used to make OUTPUT_DIR and its .lock first, then fail loading (a folder "does not exist")
    for flags, words in ((["--model", str(afile)], f"--model {afile} is a file, not a folder"),
                         (["--model", ""], "--model '' is empty: pass a name or path"),
                         (["--dataset", " "], "--dataset ' ' is empty"),
                         (["--dataset", str(cwd.parent / "data.jsonl")], "is a folder, not a file: pass a file"),
                         (["--eval-files", str(adir)], f"--eval-files {adir} is a folder, not a file"),
                         (["--eval-files", ""], "--eval-files '' is empty"),
                         (["--eval-files", str(adir / "no.jsonl")], "no.jsonl does not exist"),
                         (["--output-dir", str(afile)], f"--output-dir {afile} is a file, not a folder: pass")):
        out = ["--output-dir", "run"] if flags[0] != "--output-dir" else []
        assert words in refusal(train.main, SMALL + out + flags), flags
        assert list(cwd.iterdir()) == [], flags  # refused before OUTPUT_DIR (and its .lock) was made


def test_symlinked_log_or_checkpoint_in_output_dir_is_refused(tmp_path, toy_model_dir):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (elsewhere / "shared.jsonl").write_text("")  # an empty log elsewhere: the run used to write into it
    (run / "log.jsonl").symlink_to(elsewhere / "shared.jsonl")
    line = refusal(train.main, SMALL + ["--output-dir", str(run)])
    assert "log.jsonl is a symlink" in line and "pass another --output-dir" in line
    assert (elsewhere / "shared.jsonl").read_text() == "" and sorted(os.listdir(run)) == ["log.jsonl"]
    # a checkpoint folder elsewhere: --overwrite used to delete its COMPLETE marker through the link
    (run / "log.jsonl").unlink()
    (elsewhere / "ckpt").mkdir()
    (elsewhere / "ckpt" / "COMPLETE").write_text("")
    (run / "checkpoint-1").symlink_to(elsewhere / "ckpt")
    for flag in ("--overwrite", "--resume"):
        assert "checkpoint-1 is a symlink" in refusal(train.main, SMALL + ["--output-dir", str(run), flag])
    assert (elsewhere / "ckpt" / "COMPLETE").exists() and sorted(os.listdir(run)) == ["checkpoint-1"]
    # OUTPUT_DIR itself may be a link (runs on a scratch disk): only what is inside it is checked
    (run / "checkpoint-1").unlink()
    (tmp_path / "link").symlink_to(run)
    paths.check_no_links("--output-dir", tmp_path / "link", lambda name: True)


def test_compare_py_out_and_model(cwd):
    afile = cwd.parent / "afile"
    for argv, words in ((["--out", ""], "--out '' is empty: pass a folder"),
                        (["--out", "  "], "--out '  ' is empty"),
                        (["--model", ""], "--model '' is empty: pass a name or path"),
                        (["--out", str(afile)], f"--out {afile} is a file, not a folder")):
        assert words in refusal(compare.parse_args, argv)
    (cwd / "quick").write_text("x")  # where --quick's table would go is a file
    assert f"--out {Path('quick')} is a file" in refusal(compare.parse_args, ["--quick", "--out", "."])
    (cwd / "quick").unlink()
    assert list(cwd.iterdir()) == []


def test_compare_runs_train_py_where_its_relative_out_points(cwd, monkeypatch):
    """A relative --out from outside the repo: compare.py made OUT/runs/<run> here, but started
    train.py in the repo, where the same relative --output-dir is another folder."""
    script = ("import os, sys; d = sys.argv[sys.argv.index('--output-dir') + 1]; "
              "open(os.path.join(d, 'cwd.txt'), 'w').write(os.getcwd())")
    monkeypatch.setattr(compare, "TRAIN", [sys.executable, "-c", script])
    assert compare.launch("uniform", 0, Path("out"), [], fresh=False).wait() == 0
    assert (cwd / "out" / "runs" / "uniform-seed0" / "cwd.txt").read_text() == str(cwd)


def test_plots_py_run_dirs(cwd, tmp_path):
    afile = tmp_path / "afile"
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text("")
    (run / "plots").symlink_to(tmp_path / "adir")
    for argv, words in (([""], "RUN_DIR '' is empty"), ([str(afile)], f"RUN_DIR {afile} is a file, not a folder"),
                        ([str(tmp_path / "none")], "does not exist"), ([str(run)], "plots is a symlink")):
        assert words in refusal(plots.main, argv)
    assert list(cwd.iterdir()) == [] and list((tmp_path / "adir").iterdir()) == []


def test_assignment_py_out_dir_and_json(cwd, tmp_path):
    afile, adir = tmp_path / "afile", tmp_path / "adir"
    for argv, words in ((["build", "--out", ""], "--out '' is empty"),  # used to build into the cwd
                        (["build", "--out", str(afile)], f"--out {afile} is a file, not a folder"),
                        (["grade", ""], "DIR '' is empty"),
                        (["grade", str(afile)], f"DIR {afile} is a file, not a folder"),
                        (["grade", str(adir), "--json", ""], "--json '' is empty"),  # used to mean the default
                        (["grade", str(adir), "--json", str(adir)], f"--json {adir} is a folder, not a file"),
                        (["grade", str(adir), "--json", str(afile / "r.json")], f"folder {afile} is a file")):
        assert words in refusal(assignment.main, argv), argv
    assert list(cwd.iterdir()) == [] and list(adir.iterdir()) == []


def test_toy_and_gpu_check_out(cwd):
    assert "--out '' is empty" in refusal(toy.main, ["--rebuild", "toy", "--out", ""])
    assert "--out ' ' is empty" in refusal(gpu_check.main, ["--tiny", "--out", " "])  # used to be a temp dir
    assert list(cwd.iterdir()) == []


def test_check_path_by_hand(tmp_path):
    (tmp_path / "f").write_text("x")
    assert paths.check_path("--x", str(tmp_path), "dir", exists=True) == tmp_path
    assert paths.check_path("--x", "new/folder", "dir") == Path("new/folder")  # need not exist
    assert paths.check_path("--x", str(tmp_path / "f"), "file", exists=True) == tmp_path / "f"
    assert paths.check_path("--x", "org/model", "name") == Path("org/model")
    for value, kind, words in (("\t", "name", "is empty"), (str(tmp_path / "f"), "dir", "is a file"),
                               (str(tmp_path), "file", "is a folder")):
        with pytest.raises(SystemExit, match=words):
            paths.check_path("--x", value, kind)
