"""A checkpoint's RNG state is the rank's own: the CPU generator and the rank's own GPU, never one per visible GPU.

Ray Train shows every worker all GPUs of its node. Saving `torch.cuda.get_rng_state_all()` kept four states on a
4-GPU node, and `set_rng_state_all` on restart either failed on a node where the rank sees fewer GPUs or gave the
rank's device another GPU's state. CUDA is faked at its edge (the generator states per device index and the current
device, as Ray Train sets it); the save and restore code is the checkpoint module's own.
"""

from __future__ import annotations

import pytest
import torch

from train.checkpoint import restore_rng_state, rng_state


class FakeNode:
    """A node's GPUs as torch.cuda sees them from one worker: `count` devices, each with its generator state, and
    the worker's current device."""

    def __init__(self, monkeypatch, count: int, current: int):
        self.states = [torch.tensor([10 * count + i], dtype=torch.uint8) for i in range(count)]
        self.current = current

        def check(device: int) -> int:
            if not 0 <= device < count:
                raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
            return device

        def set_one(state, device="cuda"):
            self.states[check(self.current if device == "cuda" else int(device))] = state.clone()

        def set_all(states):
            for i, state in enumerate(states):
                set_one(state, i)

        for name, fn in {"current_device": lambda: self.current, "device_count": lambda: count,
                         "get_rng_state": lambda device="cuda": self.states[
                             check(self.current if device == "cuda" else int(device))].clone(),
                         "get_rng_state_all": lambda: [s.clone() for s in self.states],
                         "set_rng_state": set_one, "set_rng_state_all": set_all}.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_a_gpu_rank_saves_its_own_device_state_and_restores_it_on_a_node_with_fewer_gpus(monkeypatch):
    torch.manual_seed(3)
    cpu = torch.get_rng_state()
    node = FakeNode(monkeypatch, count=4, current=2)  # rank 2 of a 4-GPU node
    saved = rng_state(use_gpu=True)
    assert torch.equal(saved["cpu"], cpu)
    assert torch.equal(saved["cuda"], node.states[2])  # one state: the rank's own device's

    torch.manual_seed(4)
    small = FakeNode(monkeypatch, count=1, current=0)  # restarted where the worker sees one GPU
    restore_rng_state(saved)
    assert torch.equal(torch.get_rng_state(), cpu)
    assert torch.equal(small.states[0], torch.tensor([42], dtype=torch.uint8))  # node 1's GPU 2 state, on GPU 0

    other = FakeNode(monkeypatch, count=4, current=1)  # restarted as local rank 1 of another 4-GPU node
    untouched = [s.clone() for s in other.states]
    restore_rng_state(saved)
    assert torch.equal(other.states[1], torch.tensor([42], dtype=torch.uint8))
    assert [torch.equal(a, b) for a, b in zip(other.states, untouched)] == [True, False, True, True]


def test_a_cpu_rank_saves_no_cuda_state_and_reads_the_older_format(monkeypatch):
    torch.manual_seed(5)
    saved = rng_state(use_gpu=False)
    assert set(saved) == {"cpu"}
    FakeNode(monkeypatch, count=0, current=0)  # torch.cuda must not be asked anything on a CPU worker
    torch.manual_seed(6)
    restore_rng_state({"cpu": saved["cpu"], "cuda": []})  # what earlier versions wrote on CPU workers
    assert torch.equal(torch.get_rng_state(), saved["cpu"])


def test_control_the_per_gpu_list_fails_on_a_node_with_fewer_gpus(monkeypatch):
    """What the old save/restore did: four states in, restored onto a one-GPU worker, fails."""
    FakeNode(monkeypatch, count=4, current=2)
    every = torch.cuda.get_rng_state_all()
    FakeNode(monkeypatch, count=1, current=0)
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        torch.cuda.set_rng_state_all(every)
