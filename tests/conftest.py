"""Fixtures every folder of the tests may use. Helpers that are not fixtures (the example
files, `eventually`) are in `tests/helpers.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.worker.tinymodel import make_tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (`make_tiny_llama`'s default shape), built once per
    session. Shared: read it, never write into its folder (a test that must, or that needs
    another shape, builds its own)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-model"))
