"""Full fine-tuning (`finetune: full`) on Ray Train + DeepSpeed (CPU, gloo): SmolLM2 on two workers.

One SFT step under ZeRO-2 and under ZeRO-3 (gradient checkpointing on, chunked log-probs through the trainable tied
output head, chunk counts that differ between the ranks) must equal the same step taken in this process on the same
rows: the two ranks' losses averaged, backward, one torch AdamW step. A LoRA run of the same step is the control
whose frozen base stays bit-identical. The resume test kills a full run after its first checkpoint (tiny model).
Everything runs at float32 (`precision: fp32`), so no result depends on the CPU's bf16 kernels.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from train.config import DeepSpeedSection, LoraSection, TrainConfig
from train.preference.trainer import run_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

# two rows of different lengths: each rank gets one, and their chunk counts (8-token chunks) differ
ROWS = [
    {"prompt_messages": [{"role": "user", "content": "Grade the answer: the sky is green."}],
     "target": "Grade: 1. The sky is blue, so the answer is wrong."},
    {"prompt_messages": [{"role": "user", "content": "Grade the answer to 'two plus two' given as four, written "
                                                     "out in words by a careful student."}],
     "target": "Grade: 5."},
]
LR = 1e-4
ADAM_EPS = 1e-8  # torch AdamW's default, the optimizer `train.engine.build_engine` builds
U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32
# |g| below this many Adam eps: the step passes on more than 1e-3 of the gradient's relative error, and only the
# step's size bounds it (step_tolerance)
CONDITIONED = 1e3


def full_config(model_dir: str, stage: int, **changes) -> TrainConfig:
    base = TrainConfig(model=model_dir, loss="sft", finetune="full", num_workers=2, micro_batch_size=1, grad_accum=1,
                       max_steps=1, checkpoint_every=1, max_failures=0, lr=LR, scheduler="constant",
                       weight_decay=0.0, max_grad_norm=0.0, precision="fp32", gradient_checkpointing=True,
                       logprob_chunk_tokens=8, max_prompt_length=64, max_completion_length=24,
                       deepspeed=DeepSpeedSection(zero_stage=stage), run_name=f"full-zero{stage}")
    return dataclasses.replace(base, **changes)


def checkpoint_weights(result, step: int) -> dict[str, torch.Tensor]:
    """The fp32 weights of the run's step-`step` checkpoint, merged from the ZeRO partitions by DeepSpeed itself."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    directory = Path(result.storage_dir) / f"checkpoint_{step:06d}" / "deepspeed"
    return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=f"step_{step}")


class InProcess:
    """The engine interface the loop's loss reads (a forward, `.module`, `.device`) around a plain model."""

    def __init__(self, model):
        self.module, self.device = model, torch.device("cpu")

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def reference_step(model_dir: str, cfg: TrainConfig, dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """(initial weights, gradient, weights after the step; float32 only) of the single-process step in `dtype`: each
    rank's rows (`step_row_indices`, as the workers read them) through the loop's own loss, the losses averaged over
    the ranks as DeepSpeed averages gradients, one AdamW step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.preference.loop import _collate, loss_on_batch
    from train.sequences import step_row_indices

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (cpus_per_worker 1): the same kernels' blocking
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        engine = InProcess(model)
        head_terms, n_terms = None, 0  # float64 only: sum of |terms| of the tied head's gradient, their count
        linear_terms: dict[str, torch.Tensor] = {}  # float64 only: per nn.Linear weight, sum_t |dL/dy_t| |x_t|^T
        hooks = []
        if dtype != torch.float32:
            model.gradient_checkpointing_disable()  # the same values; hooks see each layer's pass once
            for mod_name, mod in model.named_modules():
                if isinstance(mod, torch.nn.Linear) and mod is not model.get_output_embeddings():
                    hooks.append(_terms_hooks(mod, f"{mod_name}.weight", linear_terms))
        for rank in range(cfg.num_workers):
            (indices,) = step_row_indices(0, len(ROWS), cfg.micro_batch_size, 1, cfg.num_workers, rank, cfg.seed)
            batch = _collate(tokenizer, cfg, [ROWS[i] for i in indices], engine.device)
            if dtype == torch.float32:  # the loop's own loss (chunked log-probs, float32 log-softmax)
                loss, _ = loss_on_batch(engine, cfg, batch)
            else:  # the same token-mean NLL written out, every operation in `dtype`
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"], use_cache=False, output_hidden_states=True)
                logits = out.logits[:, :-1]
                mask = batch["loss_mask"][:, 1:].bool()
                picked = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
                loss = -(picked * mask).sum() / mask.sum()
                with torch.no_grad():  # the head's gradient is sum_t dL/dz_t h_t^T: its terms' magnitudes
                    dz = logits.softmax(-1) - torch.nn.functional.one_hot(batch["input_ids"][:, 1:], logits.shape[-1])
                    dz = (dz * mask[..., None] / mask.sum() / cfg.num_workers)[mask]
                    h = out.hidden_states[-1][:, :-1][mask]
                    terms = dz.abs().T @ h.abs()
                    head_terms = terms if head_terms is None else head_terms + terms
                    n_terms += int(batch["attention_mask"].sum())  # the longest sums: over every position
            (loss / cfg.num_workers).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        for hook in hooks:
            for handle in hook:
                handle.remove()
        if dtype != torch.float32:  # only the float32 gradient is stepped: the float64 one bounds its rounding
            return initial, grads, {"head_terms": head_terms, "n_terms": n_terms, "linear_terms": linear_terms}
        torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, eps=ADAM_EPS).step()
        return initial, grads, {n: p.detach().clone() for n, p in model.named_parameters()}
    finally:
        torch.set_num_threads(threads)


def _terms_hooks(module: torch.nn.Linear, name: str, out: dict) -> tuple:
    """Hooks that add sum_t |dL/dy_t| |x_t|^T, the magnitudes of the terms of the weight's gradient sum, to
    `out[name]`."""
    inputs = {}

    def forward(_, args, _out):
        inputs["x"] = args[0].detach().reshape(-1, args[0].shape[-1])

    def backward(_, _grad_in, grad_out):
        dy = grad_out[0].detach().reshape(-1, grad_out[0].shape[-1])
        terms = dy.abs().T @ inputs["x"].abs()
        out[name] = out[name] + terms if name in out else terms

    return module.register_forward_hook(forward), module.register_full_backward_hook(backward)


def step_tolerance(w32: torch.Tensor, g32: torch.Tensor, g64: torch.Tensor, terms: torch.Tensor | None = None,
                   n_terms: int = 0) -> torch.Tensor:
    """Elementwise bound on |distributed step - in-process step| for one float32 weight, from float32's unit roundoff
    u = 2^-24 and Adam's eps, to first order in u.

    One AdamW step from a zero state (no weight decay, no clipping) is exactly w1 = w0 - lr * f(g), f(g) = g / (|g| +
    eps): m^ = g and v^ = g^2 at step 1. Both runs start from the same float32 w0 and differ by (a) their gradients,
    two float32 evaluations of the same exact g (float64's g64 stands for it), (b) the step's float32 arithmetic and
    (c) the rounding of w1.

    (c) Each run rounds w1 to nearest once, by at most u|w1|: 2u|w1| between them.
    (b) torch's AdamW rounds the step 7 times: m (lerp, 1), v (addcmul, 2, halved by the square root), sqrt (1), the
        division by sqrt(bias correction 2) (1), + eps (1), m / denom (1), times the step size (1): the computed step
        is lr * f * (1 + d), |d| <= 7u, so 14u lr between the runs. The constants (1 - beta, the bias corrections,
        the step size) are the same float32 numbers in both runs: a common factor, not a difference.
    (a) |f| < 1: every step is shorter than lr, so two steps differ by less than 2 lr whatever their gradients. f'(g)
        = eps / (|g| + eps)^2, so gradients dg apart move the step by at most lr * eps * dg / (|g| + eps)^2: the
        step passes on the fraction eps / (|g| + eps) of the gradient's relative error dg / |g|. dg bounds
        |g_in_process - g| + |g_distributed - g|:
        - 2 n u sum|terms| where the weight's gradient is one sum over the positions of both ranks (n: every
          position, at least the terms' count) of terms whose magnitudes the float64 pass gives (the tied head:
          |dL/dz_t| |h_t|^T; every linear weight: |dL/dy_t| |x_t|^T, from hooks): float32's classical bound on a
          sum of n products in any order is n u sum|terms| for each run;
        - 4|g32 - g64| for what reaches a gradient from the layers it was propagated through (dL/dy and x are float32
          results themselves) and for the weights without such a sum (the norms; the embedding's input side): no
          bound of practical size follows from u for a 30-layer backward pass, so the in-process float32 error is
          measured against float64 and the distributed one, the same computation in another order, is allowed three
          times as much;
        - 8u|g| for the roundings after the sum (the ranks' sum, the division by the world size, the copies into
          ZeRO's flat buffers: exact or one rounding each) and float64's own error (2^-29 of float32's).
        With |g| >= CONDITIONED eps the step passes on at most 1e-3 of the gradient's relative error, so an error
        beyond dg (dg measures the in-process error at that one element, which can be small by chance) moves the
        step by a thousandth of it. Below, the factor tends to 1, and where |g| is small against the terms it sums
        an error carried in from other layers is not small against g: nothing but the step's size bounds the step,
        2 lr.
    Bound: 2u|w1| + lr * (14u + min(2, eps * dg / (|g| + eps)^2)), and 2u|w1| + lr * (14u + 2) for |g| < CONDITIONED
    eps.
    """
    dg = 4 * (g32.double() - g64).abs() + 8 * U32 * g64.abs()
    if terms is not None:
        dg = dg + 2 * n_terms * U32 * terms
    through = (ADAM_EPS * dg / (g64.abs() + ADAM_EPS) ** 2).clamp(max=2.0)
    # ill-conditioned elements (|g| < CONDITIONED eps): bounded by the step's size only (docstring)
    through = torch.where(g64.abs() < CONDITIONED * ADAM_EPS, torch.full_like(through, 2.0), through)
    return (2 * U32 * w32.double().abs() + LR * (14 * U32 + through)).float()


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    """(initial weights, weights after the in-process step, their elementwise tolerance), float32 each."""
    cfg = full_config(smollm2_dir, 2)
    initial, g32, after = reference_step(smollm2_dir, cfg, torch.float32)
    _, g64, head = reference_step(smollm2_dir, cfg, torch.float64)
    tied = "model.embed_tokens.weight"
    terms = {**head["linear_terms"], tied: head["head_terms"]}
    bounds = {name: step_tolerance(after[name], g32.pop(name), g64.pop(name), terms.get(name), head["n_terms"])
              for name in list(after)}
    return initial, after, bounds


@pytest.mark.parametrize("stage", [2, 3])
def test_one_full_step_under_zero_equals_the_single_process_step(stage, ray_local, smollm2_dir, reference,
                                                                 tmp_path):
    initial, expected, bounds = reference
    checked = sum(int((b < 2 * LR).sum()) for b in bounds.values())
    assert checked > 0.1 * sum(b.numel() for b in bounds.values()), "too few well-conditioned elements to compare"
    cfg = full_config(smollm2_dir, stage)
    result = run_training(cfg, ROWS, run_dir=str(tmp_path))
    assert result.metrics["step"] == 1 and result.adapter_dir is None
    trained = checkpoint_weights(result, 1)
    # the tied output head is the input embedding: one trainable weight (DeepSpeed's merge names it twice)
    head = trained.pop("lm_head.weight", None)
    assert head is None or torch.equal(head, trained["model.embed_tokens.weight"])
    assert set(trained) == set(initial) and "lm_head.weight" not in initial
    for name, before in initial.items():
        after = trained[name]
        assert not torch.equal(after, before), f"{name}: full fine-tuning left it unchanged"
        bound = bounds[name]
        err = (after - expected[name]).abs()
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (
            f"{name}: |distributed - in-process| = {float(err.flatten()[worst]):.3g} > bound "
            f"{float(bound.flatten()[worst]):.3g} at element {worst}")
    # the 16-bit export: what `model=` loads, the trained weights rounded to bfloat16, with the tokenizer
    export = Path(result.model_dir)
    assert export == tmp_path / "model" and (export / "tokenizer_config.json").is_file()
    assert json.loads((export / "config.json").read_text()).get("dtype") == "bfloat16"
    from transformers import AutoModelForCausalLM

    loaded = dict(AutoModelForCausalLM.from_pretrained(str(export), dtype="auto").named_parameters())
    name = "model.embed_tokens.weight"
    assert loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], trained[name].to(torch.bfloat16))


def test_the_lora_control_leaves_every_frozen_weight_bit_identical(ray_local, smollm2_dir, tmp_path):
    """The same step with LoRA: the adapter moves, the frozen base does not (`base_drift`: per frozen parameter,
    the float64 sum and sum of squares before and after, on every rank)."""
    cfg = full_config(smollm2_dir, 3, finetune="lora", lora=LoraSection(r=4, alpha=8), run_name="lora-control")
    result = run_training(cfg, ROWS, run_dir=str(tmp_path))
    assert result.metrics["base_drift"] == 0.0 and result.model_dir is None
    assert (Path(result.adapter_dir) / "adapter_model.safetensors").is_file()


def test_a_killed_full_run_resumes_to_the_uninterrupted_runs_weights(ray_local, tiny_model_dir, tmp_path):
    """Full checkpoints (weights, fp32 master, Adam moments, schedule, RNG) resume: a run whose last rank raises
    after its step-2 checkpoint restarts there and ends where the uninterrupted run (same seed) ends."""
    rows = [{"prompt_messages": [{"role": "user", "content": f"Say {i}."}], "target": f"{i} {i + 1} {i + 2}"}
            for i in range(8)]
    cfg = full_config(tiny_model_dir, 2, max_steps=4, checkpoint_every=2, max_failures=1, lr=1e-3,
                      run_name="uninterrupted")
    plain = run_training(cfg, rows, run_dir=str(tmp_path / "plain"))
    resumed = run_training(dataclasses.replace(cfg, run_name="killed", fail_at_step=2), rows,
                           run_dir=str(tmp_path / "killed"))
    assert resumed.metrics["start_step"] == 2 and resumed.metrics["step"] == plain.metrics["step"] == 4
    a, b = checkpoint_weights(plain, 4), checkpoint_weights(resumed, 4)
    assert a.keys() == b.keys()
    for name in a:  # same process layout, same kernels, same order: the same bits
        assert torch.equal(a[name], b[name]), name
