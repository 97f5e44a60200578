"""Checkpoints, reports and W&B of every trainer's Ray Train worker (`train.preference.loop`, `train.grpo.loop`).

A checkpoint (Ray Train merges the workers' directories into one) holds:
    deepspeed/step_<k>/...   DeepSpeed `save_checkpoint` per rank: the trainable weights, optimizer, LR scheduler
                             (LoRA: frozen base weights excluded, they are reloaded from `model_dir`; finetune
                             full: the whole model with Adam's moments and, at bf16, fp32 master weights: 12
                             bytes a parameter at fp32, 14 at bf16, about 52 GiB for a 4B model), the step and the
                             loop's client state (GRPO: its count of off-policy steps)
    rng/rank<r>.pt           each rank's torch RNG state, CPU and its own GPU (LoRA dropout), so a resumed run
                             replays the same masks
    adapter/                 rank 0's peft `save_pretrained` of the LoRA adapter (finetune lora), or
    model/                   the 16-bit Hugging Face export of the whole model (finetune full, `export_model`)
    train_state.json         step and total steps
On start a worker restores all of that from `ray.train.get_checkpoint()` and continues at the saved step.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import ray.train
import torch

from core.tracking import start_worker_run
from train import collectives
from train.config import TrainerBase
from train.engine import export_model, lora_state_dict

Metrics = dict[str, float]


def save_checkpoint(engine, cfg: TrainerBase, directory: str, step: int, total: int, rank: int,
                    client_state: dict | None = None) -> None:
    """Write this rank's part of the checkpoint described in the module docstring into `directory`; `client_state`
    (numbers the loop keeps across steps) is saved with the step in DeepSpeed's client state."""
    engine.save_checkpoint(os.path.join(directory, "deepspeed"), tag=f"step_{step}",
                           client_state={**(client_state or {}), "step": step}, exclude_frozen_parameters=True)
    rng = Path(directory) / "rng"
    rng.mkdir(exist_ok=True)
    torch.save(rng_state(cfg.use_gpu), rng / f"rank{rank}.pt")
    if cfg.finetune == "full":  # the 16-bit export (a collective under ZeRO-3: every rank calls it)
        export_model(engine, cfg.deepspeed.zero_stage, rank, os.path.join(directory, "model"))
    else:
        lora = lora_state_dict(engine, cfg.deepspeed.zero_stage)  # a collective under ZeRO-3: every rank calls it
        if rank == 0:
            engine.module.save_pretrained(os.path.join(directory, "adapter"), state_dict=lora)
    if rank == 0:
        state = {"step": step, "total_steps": total}
        (Path(directory) / "train_state.json").write_text(json.dumps(state) + "\n")


def restore_checkpoint(engine, rank: int, state: dict | None = None) -> int:
    """Load the latest Ray Train checkpoint into the engine and RNG; return the step to continue at (0 if none).
    `state`, when given, receives the checkpoint's client state (what `save_checkpoint` was handed)."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        # strict=False: the frozen base weights were left out on purpose and already came from model_dir
        path, client_state = engine.load_checkpoint(os.path.join(directory, "deepspeed"), load_module_strict=False)
        if path is None:
            raise RuntimeError(f"no DeepSpeed checkpoint under {directory}/deepspeed")
        rng = torch.load(Path(directory) / "rng" / f"rank{rank}.pt", weights_only=False)
    if state is not None:
        state.update(client_state)
    restore_rng_state(rng)
    return int(client_state["step"])


def rng_state(use_gpu: bool) -> dict:
    """This rank's RNG state: the CPU generator's and, on a GPU worker, its own device's only. Ray Train shows a
    worker every GPU of its node, so `get_rng_state_all` would save one state per visible GPU (4 on a g5.12xlarge),
    and a restart on a node where the rank sees fewer GPUs would fail to restore them, or restore another GPU's."""
    state = {"cpu": torch.get_rng_state()}
    if use_gpu:
        device = torch.cuda.current_device()  # the rank's own: Ray Train sets it to the worker's GPU
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what `rng_state` saved; the CUDA state goes to this rank's current device, whichever index it has
    on the node the worker restarted on."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if isinstance(cuda, (list, tuple)):  # an older checkpoint's format: one state per visible GPU (empty on CPU)
        device = torch.cuda.current_device() if cuda else 0
        cuda = cuda[device] if device < len(cuda) else None
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, torch.cuda.current_device())


def report_step(engine, cfg: TrainerBase, metrics: Metrics, step: int, total: int, rank: int, save: bool,
                tracker, client_state: dict | None = None) -> None:
    """Log `metrics` to W&B (rank 0's `tracker`) and Ray Train, with a checkpoint when `save`."""
    if tracker is not None:
        tracker.log(metrics, step=step)
    if step == total:  # after W&B, which takes numbers only
        metrics = {**metrics, "worker_nodes": worker_nodes()}
    if not save:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(engine, cfg, directory, step, total, rank, client_state)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_dir_name=f"checkpoint_{step:06d}")


def worker_nodes() -> list[str]:
    """The Ray node id of every rank, by rank (a collective): where `cpus_per_worker` / `resources_per_worker` /
    `use_gpu` placed the workers, recorded with the run's final metrics (`ray list nodes` maps ids to addresses)."""
    return collectives.gather_objects(ray.get_runtime_context().get_node_id())


def init_wandb(cfg: TrainerBase, config: dict, rank: int):
    """Rank 0's W&B run (`core.tracking.start_worker_run`); one id per run folder so restarted workers append. The
    key, when online, was installed from `config["secrets"]`."""
    run_id = config.get("wandb_id") or hashlib.sha1(config["wandb_dir"].encode()).hexdigest()[:12]
    return start_worker_run(cfg, run_id=run_id, local_dir=config["wandb_dir"], config=config["train"], rank=rank)
