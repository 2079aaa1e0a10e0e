"""Fixtures every folder of the tests may use. Helpers that are not fixtures (the example
files, `eventually`) are in `tests/helpers.py`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (`make_tiny_llama`'s default shape), built once per
    session. Shared: read it, never write into its folder (a test that must, or that needs
    another shape, builds its own)."""
    from cadence.worker.tinymodel import make_tiny_llama  # noqa: PLC0415  # torch: only where needed

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-model"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `kubectl` run the kubectl binary: skipped, saying so, where it is not
    on PATH (they failed with FileNotFoundError)."""
    if shutil.which("kubectl") is not None:
        return
    skip = pytest.mark.skip(reason="kubectl is not on PATH")
    for item in items:
        if item.get_closest_marker("kubectl") is not None:
            item.add_marker(skip)
