"""A defect seeded into the Ray Train workers of tests/test_rehearsal_defects.py, no source file edited.

Python imports `sitecustomize` at the start of every process that has this folder on its PYTHONPATH (the test puts it
in the trainer's `env_vars`, so only the training workers see it). It makes `train.grpo.loop._any_worker` what it
was at 1761e29: a direct `torch.distributed.all_reduce` of a CPU tensor instead of `train.collectives.any_rank`,
the call NCCL refuses ("No backend type associated with device type cpu") and gloo runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "train.grpo.loop"


def seeded_any_worker(flag: bool) -> bool:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(flag)])
    dist.all_reduce(tensor)
    return bool(tensor.item() > 0)


class _Seed(importlib.abc.MetaPathFinder):
    """Replaces `_any_worker` as soon as the loop's module has run (the loop looks it up at each step)."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._any_worker = seeded_any_worker

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Seed())
