"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The offline dataset copies: ``$FEDOWEN_DATA`` when set (as the apps read it; a checkout
    elsewhere than beside ``shared/``), else ``<repo>/../shared/data``; skip when absent, except
    under CI (``CI`` set), where missing data would make the data tests pass vacuously."""
    env = os.environ.get("FEDOWEN_DATA", "").strip()
    data = Path(env).expanduser().resolve() if env else SHARED_DATA
    if not data.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the datasets are missing at {data}")
        pytest.skip(f"offline datasets not found at {data} (set FEDOWEN_DATA, or put them at "
                    "<repo>/../shared/data)")
    return data


@pytest.fixture(scope="session", autouse=True)
def fedowen_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``FEDOWEN_CACHE`` at one session-wide temp dir.

    Tests never write into the user's ``~/.cache/fedowen``, and each dataset is decoded at
    most once per test session (the on-disk cache plus the loader's in-process cache).
    """
    path = tmp_path_factory.mktemp("fedowen-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDOWEN_CACHE", str(path))
        yield path


@pytest.fixture(autouse=True)
def flower_task_identity() -> Iterator[None]:
    """Let tests build Flower ``Message``s outside a running app (see
    :func:`sim.inline_grid.task_identity`)."""
    from sim.inline_grid import task_identity

    with task_identity():
        yield
