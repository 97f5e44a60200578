"""GRPO rollouts sampled by the training policy itself with `generate` (the `rollout.kind: hf` engine).

Its own module so that validation (`train.grpo.validate`, which samples the base model's answers with it) and the
training loop (`train.grpo.loop`) both use it without importing each other.
"""

from __future__ import annotations

import torch

from train.config import GRPOConfig
from train.grpo.batch import trim_completion


class HFRollout:
    """Sampling from the training policy itself with `generate` (CPU, small GPU runs).

    The rollouts come from the weights as they are when `generate` runs, so GRPO stays on-policy with no weight sync
    (`sync` is a no-op; with `rollout.max_staleness: 1` the next step's rollouts are generated before the update:
    `train.grpo.staleness`); `train.grpo.rollout_vllm.VLLMRollout` is the fast engine for GPUs, synced after every
    optimizer step. With `finetune: full` the model is every trained weight, so each step samples the weights the
    last update wrote.
    """

    def __init__(self, tokenizer, cfg: GRPOConfig, synced_gpus: bool):
        self.tokenizer, self.cfg, self.synced_gpus = tokenizer, cfg, synced_gpus
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def sync(self, engine) -> None:
        """Nothing to sync: `generate` reads the training model itself."""

    def release(self) -> None:
        """Nothing to release before an update: the rollouts come from the training model itself."""

    def stop_ids(self, model) -> set[int]:
        eos = model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids | ({self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set())

    def generate(self, model, prompts: list[list[int]], group_size: int, seed: int = 0, first: int = 0,
                 adapter: bool = True) -> tuple[list[list[int]], list[bool]]:
        """G sampled completions per prompt, group-major; each trimmed after its stop token (torch's global RNG,
        seeded by the caller, drives the sampling; `seed` and `first`, the step index of the first prompt when a
        step generates in several calls, are for engines with their own generator). `adapter` False samples the
        peft model with its LoRA adapter disabled: the initial policy.

        Returns:
            ``(completion_ids, finished)``, one entry per rollout.
        """
        if adapter:
            return self._generate(model, prompts, group_size)
        if not hasattr(model, "disable_adapter"):
            raise ValueError("finetune full has no adapter to switch off: the initial policy's answers are sampled "
                             "before the first update (train.grpo.validate)")
        with model.disable_adapter():
            return self._generate(model, prompts, group_size)

    @torch.no_grad()
    def _generate(self, model, prompts: list[list[int]], group_size: int) -> tuple[list[list[int]], list[bool]]:
        width = max(len(p) for p in prompts)
        # left padding: every prompt ends where generation starts
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        stops = self.stop_ids(model)
        was_training = model.training
        model.eval()
        try:
            out = model.generate(
                input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=True,
                temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p, top_k=self.cfg.rollout.top_k,
                max_new_tokens=self.cfg.max_completion_length, num_return_sequences=group_size,
                pad_token_id=self.pad_id, eos_token_id=sorted(stops), use_cache=True,
                # ZeRO-3 gathers parameters collectively in every forward: ranks must decode equally many steps
                synced_gpus=self.synced_gpus)
        finally:
            model.train(was_training)
        trimmed = [trim_completion(row.tolist(), stops, self.pad_id) for row in out[:, width:]]
        return [t[0] for t in trimmed], [t[1] for t in trimmed]
