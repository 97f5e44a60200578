"""Driver side of GRPO: `GRPOConfig` + prompt rows + a reward spec -> Ray Train `TorchTrainer` -> `TrainResult`.

    from train.config import GRPOConfig
    from train.grpo.trainer import run_grpo
    cfg = GRPOConfig(model="smollm2-135m", group_size=8, prompts_per_step=32, num_workers=2)
    result = run_grpo(cfg, rows, {"kind": "judge", "config": {}}, run_dir="runs/judge-grpo")
    result.adapter_dir                                           # <run_dir>/adapter

Rows are ``{"id", "prompt_messages", ...}`` plus what the reward needs (judge: ``gold_a``, ``gold_b``; GRM:
``judge_prompt``). The reward spec is plain data (``train.grpo.reward.build.build_reward`` turns it into a callable on
each worker), so nothing unpicklable travels to the workers. Everything else (storage, checkpoints, resume, the
adapter copy, W&B offline on rank 0) works exactly as in preference training (`train/trainer.py`), whose helpers
are reused: both configs are one family (`train/config.py`), sharing the lora, deepspeed, optimiser, worker,
checkpoint and W&B fields.

Defaults are MENLO's judge-RL settings (paper 003 §3.2, verl defaults where the paper is silent): G = 8, 32
prompts per step, lr 1e-6 constant, clip 0.2, no KL, token-mean loss, std-normalised advantages, sampling at T=1.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from train.config import GRPOConfig
from train.trainer import TrainResult, _collect, build_trainer, check_workers_fit, worker_secrets


def plan_steps(cfg: GRPOConfig, n_rows: int) -> int:
    """Optimizer steps of the run; raises ValueError when the rows do not fill one step."""
    from train.sequences import plan_total_steps

    if n_rows < cfg.prompts_per_step:
        raise ValueError(f"prompts_per_step: {cfg.prompts_per_step} is more than the {n_rows} prompt rows")
    return plan_total_steps(n_rows, cfg.prompts_per_step, cfg.epochs, cfg.max_steps)


def build_grpo_trainer(cfg: GRPOConfig, loop_config: dict, storage_path: str) -> Any:
    """The `TorchTrainer` running `train.grpo.loop.grpo_loop_per_worker`; same scaling/run config as preference
    training (`train.trainer.build_trainer`). Secrets ride in `loop_config["secrets"]` (actors.secrets), never in
    the workers' runtime env, which Ray logs in clear text."""
    return build_trainer(cfg, loop_config, storage_path, loop=grpo_worker)


def grpo_worker(config: dict) -> None:
    """Every worker's function: `train.grpo.loop.grpo_loop_per_worker`, imported in the worker. Ray pickles this
    function by reference, so the driver never imports the loop's DeepSpeed, peft and vLLM modules (seconds of a
    training stage's start on 2 cores, and memory the driver does not need)."""
    from train.collectives import guard_for_rehearsal

    # a rehearsal's check of the cluster's device rule (train.collectives; a no-op elsewhere), before the loop's
    # modules are imported
    guard_for_rehearsal()
    from train.grpo.loop import grpo_loop_per_worker

    grpo_loop_per_worker(config)


def run_grpo(cfg: GRPOConfig, rows: list[dict], reward: dict, *, run_dir: str,
             secret_env: dict[str, str] | None = None, val_rows: list[dict] | None = None,
             wandb_dir: str = "", where: str = "grpo") -> TrainResult:
    """Train a LoRA adapter with GRPO on Ray Train workers; the final adapter lands in ``<run_dir>/adapter``.

    Args:
        cfg: The run config (validated here).
        rows: Prompt rows (see the module docstring).
        val_rows: Held-out prompt rows of the same shape: validated every ``eval_every`` steps and after the last;
            the best adapter by the ``val_metric`` score lands in ``<run_dir>/best_adapter`` (with ``best.json``;
            ``finetune: full``: the 16-bit model export in ``<run_dir>/best_model``).
        reward: Reward spec for `train.grpo.reward.build.build_reward` (``{"kind": "judge" | "grm", ...}``).
        run_dir: Output folder: resolved config, Ray Train storage (unless ``storage_path`` is set), adapter.
        secret_env: Variables the workers need but no file may hold (the reward service's bearer token).
        wandb_dir: Where rank 0 writes its W&B run ("" = Ray Train's run folder); jobs pass the run directory so
            the printed `wandb sync` path survives the stage's rename.
        where: The config key of `cfg` (errors about the worker group name ``<where>.num_workers``, ...).

    Returns:
        The `TrainResult` (metrics of the last step: rewards, failures, KL, clip fraction, tokens/s, ...).

    Raises:
        ValueError: invalid config, or too few rows for one step.
        ray.train.TrainingFailedError: the workers failed more than ``max_failures`` times.
    """
    from actors.models import resolve_model_dir
    from train.grpo.reward.build import check_reward_spec, check_rows

    cfg.validate()
    check_workers_fit(cfg, where)
    check_reward_spec(reward)
    if cfg.val_metric == "vs_baseline" and reward["kind"] != "grm":
        raise ValueError(f"val_metric: vs_baseline needs the served GRM to compare answers, not a {reward['kind']} "
                         "reward (use val_metric: reward)")
    check_rows(reward, rows)
    if val_rows:
        check_rows(reward, val_rows)
    total_steps = plan_steps(cfg, len(rows))
    best_name = "best_model" if cfg.finetune == "full" else "best_adapter"  # the 16-bit export or the adapter
    out = Path(run_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    storage_path = cfg.storage_path or str(out / "ray")
    (out / "grpo_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    loop_config = {
        "train": dataclasses.asdict(cfg), "model_dir": resolve_model_dir(cfg.model), "rows": rows,
        "reward": reward, "total_steps": total_steps, "wandb_dir": wandb_dir or str(Path(storage_path) / cfg.run_name),
        "val_rows": list(val_rows or []), "best_dir": str(out / best_name),
        # the values of the named variables as set here (and the W&B key when online); each worker installs them
        "secrets": worker_secrets(cfg, secret_env or {}),
    }
    result = build_grpo_trainer(cfg, loop_config, storage_path).fit()
    if result.error is not None:
        raise result.error
    collected = _collect(result, out, str(Path(storage_path) / cfg.run_name))
    record = out / best_name / "best.json"
    if record.is_file():
        collected.best = json.loads(record.read_text())
        if cfg.finetune == "full":
            collected.best_model_dir = str(record.parent)
        else:
            collected.best_adapter_dir = str(record.parent)
    return collected
