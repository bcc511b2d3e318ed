"""Shared test setup: the repo root on sys.path, and the committed toy model (lab/, see toy.py)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def toy_model_dir():
    """The committed default toy model, lab/toy-w900 (no warm-up at test time)."""
    import toy

    return toy.ensure_toy_model("toy")
