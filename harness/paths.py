"""Path flags: the one check for every command-line flag that names a file or a folder.

Not part of the paper (arXiv 2602.03048): plumbing that keeps a slip of the shell from writing a run
somewhere else. Path("") is ".", so `--output-dir ''` (say, an unset `$OUT`) used to put a whole run
into the current directory with exit 0; a blank name made a folder called " "; a file where a folder
was expected (or the reverse) failed late, with a traceback or after the slow part; a symlinked
log.jsonl or checkpoint-<N> in OUTPUT_DIR had the run write, truncate or delete through the link,
outside OUTPUT_DIR. Each is now one line naming the fix (`error: --x ...`), before anything is
read or written:

    check_path(flag, value, kind)        empty or blank; a file where a folder is expected ("dir"),
                                         a folder where a file is ("file"); missing (exists=True)
    check_no_links(flag, folder, own)    an entry the program writes or deletes in `folder` that is
                                         a symlink

Used by cli.resolve_args (train.py), compare.py, plots.py, assignment.py, toy.py and gpu_check.py.
It imports nothing of the project, so every file may import it (tests/test_layout.py).
Tests: tests/test_paths.py.
"""
from __future__ import annotations

import os
from pathlib import Path

NOUN = {"dir": "folder", "file": "file", "name": "name or path"}


def check_path(flag: str, value: str, kind: str = "dir", exists: bool = False) -> Path:
    """Path(value) for `flag`, or SystemExit with one line saying what is wrong and how to fix it.

    kind: "dir" (a folder: an existing file is refused), "file" (an existing folder is refused),
    or "name" (a name or a path, e.g. --model: only emptiness is checked). exists: it must exist."""
    if not value.strip():  # Path("") and Path(".") are the same path: the empty value would mean "here"
        raise SystemExit(f"error: {flag} {value!r} is empty: pass a {NOUN[kind]} (an unset shell variable?)")
    path = Path(value)
    if kind == "dir" and path.exists() and not path.is_dir():
        raise SystemExit(f"error: {flag} {value} is a file, not a folder: pass a folder, or move the file away")
    if kind == "file" and path.is_dir():
        raise SystemExit(f"error: {flag} {value} is a folder, not a file: pass a file")
    if exists and not path.exists():
        raise SystemExit(f"error: {flag} {value} does not exist: check the path")
    return path


def check_no_links(flag: str, folder: Path, own) -> None:
    """SystemExit if an entry of `folder` whose name satisfies own(name) (one the program writes,
    truncates or deletes there) is a symlink: writing through it would change what it points to,
    and deleting a checkpoint through one would empty a folder elsewhere. `folder` itself may be a
    link (runs/ on a scratch disk): only what is inside it is checked. A missing folder is fine."""
    if not folder.is_dir():
        return
    for entry in sorted(folder.iterdir()):
        if own(entry.name) and entry.is_symlink():
            raise SystemExit(f"error: {flag} {folder}: {entry.name} is a symlink (to {os.readlink(entry)}), and "
                             f"this would write and delete through it: replace the link with a copy of what "
                             f"it points to, or pass another {flag}")
