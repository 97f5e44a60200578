"""Shared fixtures. Data comes from ../shared/data beside the repository; nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("QUORUM_SHARED_DATA", REPO.parent / "shared" / "data"))

# Keep every test offline and W&B local, whatever the developer's shell says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set QUORUM_SHARED_DATA)")
    return SHARED_DATA
