"""Shared test setup: the repo root on sys.path, and the warmed-up toy model built once per session."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def toy_model_dir():
    """The cached toy model (built on first use, ~2 min on 2 cores; reused afterwards)."""
    import toy

    return toy.ensure_toy_model(progress=False)
