"""The lecture notebook (issue 44): it runs top to bottom, and its two forms say the same.

- A fresh copy of notebooks/coba_rl.ipynb (its committed outputs dropped) is executed with nbclient
  in a python3 kernel of this interpreter, from notebooks/ as Jupyter would start it; an error in any
  cell fails the test. Its training run (Section 5, `python train.py ...` in a subprocess) writes
  into tmp_path (COBA_NOTEBOOK_RUN); COBA_CACHE passes through from the environment. ~2-3 min on
  2 CPU cores.
- notebooks/coba_rl.py, jupytext's percent form (the one a review reads as a diff), has the same
  cells as the .ipynb.
- The committed .ipynb holds the outputs of one run top to bottom (so it renders on GitHub), in a
  reasonable size.

Re-pair and re-execute after an edit (docs/teaching.md):
    jupytext --sync notebooks/coba_rl.py && jupyter execute --inplace notebooks/coba_rl.ipynb
"""
from __future__ import annotations

from pathlib import Path

import jupytext
import nbclient
import nbformat
from ipykernel.kernelspec import install

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "coba_rl.ipynb"
PAIRED = ROOT / "notebooks" / "coba_rl.py"
MAX_BYTES = 1_000_000  # outputs included: PNGs at 72 dpi keep it near 0.4 MB


def cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def test_the_py_and_the_ipynb_have_the_same_cells():
    committed = nbformat.read(NOTEBOOK, as_version=4)
    paired = jupytext.read(PAIRED)
    assert cells(paired) == cells(committed), (
        "notebooks/coba_rl.py and notebooks/coba_rl.ipynb differ: run "
        "`jupytext --sync notebooks/coba_rl.py` and re-execute the notebook")


def test_the_committed_notebook_is_executed_top_to_bottom_and_small():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "execute it in one run, top to bottom"
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    assert sum("image/png" in o.get("data", {}) for c in code for o in c.outputs) >= 4  # sections 2, 3, 5, 6
    assert NOTEBOOK.stat().st_size < MAX_BYTES, f"{NOTEBOOK.name} is {NOTEBOOK.stat().st_size:,} bytes"


def test_a_fresh_copy_runs_top_to_bottom(tmp_path, monkeypatch):
    # A kernel spec of this interpreter (sys.executable), found first: the venv's own "python3" spec
    # says `python`, which is whatever PATH finds first.
    install(prefix=str(tmp_path / "jupyter"), kernel_name="coba-rl-test")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter" / "share" / "jupyter"))
    monkeypatch.setenv("COBA_NOTEBOOK_RUN", str(tmp_path / "run"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for c in nb.cells:  # a fresh copy: nothing of the committed run survives
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    copy = tmp_path / NOTEBOOK.name
    nbformat.write(nb, copy)
    nb = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="coba-rl-test", timeout=600,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on any cell's error
    finally:
        nbformat.write(nb, copy)  # the executed copy stays in tmp_path for a look after a failure
    assert (tmp_path / "run" / "log.jsonl").exists()  # Section 5 trained where it was told to
    assert all(o.output_type != "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)
