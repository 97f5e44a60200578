"""Adapters for LENS (Maddela et al. 2023) and LENS-SALSA (Heineman et al. 2023).

Both are learned metrics distributed by the `lens-metric` package, whose usual entry point
downloads the checkpoints from the Hugging Face hub. We never download: a job must point at a
local checkpoint file, either by argument or through an environment variable:

- LENS (reference-based):       `model_path=` or `QUORUM_LENS_PATH`
- LENS-SALSA (reference-free):  `model_path=` or `QUORUM_LENS_SALSA_PATH`

The path is the `.ckpt` file (e.g. `.../lens/checkpoints/epoch=5-step=6102.ckpt`). Note that
`lens-metric` also instantiates its RoBERTa encoder by hub name, so the machine needs that
encoder in its local Hugging Face cache with HF_HUB_OFFLINE=1.

When no path is configured, the path does not exist, or `lens-metric` is not installed, the
functions raise `MetricUnavailable` with a message saying what to set; nothing is silently
skipped. `lens-metric` is deliberately not a project dependency (it pins its own torch stack).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

ENV_VARS = {"lens": "QUORUM_LENS_PATH", "lens_salsa": "QUORUM_LENS_SALSA_PATH"}
_NAMES = {"lens": "LENS", "lens_salsa": "LENS-SALSA"}


class MetricUnavailable(RuntimeError):
    """A metric cannot run here: its model or package is not configured or not installed."""


def resolve_model_path(variant: str, model_path: str | Path | None = None) -> Path:
    """The local checkpoint to load for `variant`, from the argument or the environment.

    Args:
        variant: 'lens' or 'lens_salsa'.
        model_path: explicit checkpoint path; overrides the environment variable.

    Returns:
        The existing checkpoint path.

    Raises:
        ValueError: unknown variant.
        MetricUnavailable: nothing configured, or the configured path does not exist.
    """
    if variant not in ENV_VARS:
        raise ValueError(f"unknown LENS variant {variant!r}: expected one of {', '.join(ENV_VARS)}")
    env = ENV_VARS[variant]
    configured = model_path if model_path is not None else os.environ.get(env)
    if not configured:
        raise MetricUnavailable(
            f"{_NAMES[variant]} is not configured: pass model_path= or set {env} to a local "
            "checkpoint (.ckpt) file; models are never downloaded at run time"
        )
    path = Path(configured).expanduser()
    if not path.exists():
        source = "model_path" if model_path is not None else env
        raise MetricUnavailable(f"{_NAMES[variant]} checkpoint {path} (from {source}) does not exist")
    return path


def _import_lens():
    if importlib.util.find_spec("lens") is None:
        raise MetricUnavailable(
            "the 'lens-metric' package is not installed, so LENS/LENS-SALSA cannot run; "
            "install it (pip install lens-metric --no-deps, in an environment whose torch it accepts)"
        )
    return importlib.import_module("lens")


def load_metric(variant: str, model_path: str | Path | None = None, rescale: bool = True):
    """Load LENS or LENS-SALSA from a local checkpoint (cached per variant and path).

    Args:
        variant: 'lens' or 'lens_salsa'.
        model_path: checkpoint path; None reads the variant's environment variable.
        rescale: LENS only: rescale scores to 0..100 as the authors recommend.

    Returns:
        The `lens` package's metric object.
    """
    path = resolve_model_path(variant, model_path)
    _import_lens()
    return _load_cached(variant, str(path), rescale)


@lru_cache(maxsize=2)
def _load_cached(variant: str, path: str, rescale: bool):
    lens = _import_lens()
    if variant == "lens":
        return lens.LENS(path, rescale=rescale)
    salsa_cls = getattr(lens, "LENS_SALSA", None)
    if salsa_cls is None:  # older lens-metric releases keep it in a submodule
        salsa_cls = importlib.import_module("lens.lens_salsa").LENS_SALSA
    return salsa_cls(path)


def score_lens(
    orig: Sequence[str], sys: Sequence[str], refs_per_sent: Sequence[Sequence[str]],
    model_path: str | None = None, batch_size: int = 8, devices=None,
) -> list[float]:
    """LENS score of each output (reference-based).

    Args:
        orig: source sentences.
        sys: system outputs.
        refs_per_sent: references of each sentence.
        model_path: checkpoint path; None reads QUORUM_LENS_PATH.
        batch_size: batch size passed to lens-metric.
        devices: lens-metric's `devices` argument (e.g. [0] for the first GPU; None for its default).

    Returns:
        One float per output.
    """
    metric = load_metric("lens", model_path)
    return [float(s) for s in metric.score(list(orig), list(sys), [list(r) for r in refs_per_sent],
                                           batch_size=batch_size, devices=devices)]


def score_lens_salsa(
    orig: Sequence[str], sys: Sequence[str], model_path: str | None = None, batch_size: int = 8, devices=None,
) -> list[float]:
    """LENS-SALSA score of each output (reference-free); arguments as `score_lens`."""
    metric = load_metric("lens_salsa", model_path)
    scores, _word_level = metric.score(list(orig), list(sys), batch_size=batch_size, devices=devices)
    return [float(s) for s in scores]
