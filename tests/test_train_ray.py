"""Preference training end to end on Ray Train + DeepSpeed (CPU, gloo) + LoRA, on the tiny random Llama.

Four real 2-worker runs of a few ARPO steps each: ZeRO-2, ZeRO-2 with a worker failure (the ZeRO-2 run is its
uninterrupted reference), ZeRO-3, and ZeRO-3 with gradient checkpointing and chunked log-probs (the ZeRO-3 run is the
adapter it must reach).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from wandb_reader import find_run_files, read_run

from train.config import DeepSpeedSection, LoraSection, TrainConfig
from train.preference.trainer import run_training

# the timeout turns a wait for CPUs held by another test's Ray actors into a failure instead of a hang
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM = "Rewrite the sentence in simpler words."
SOURCES = [
    "The committee postponed the decision indefinitely.", "He was unable to attend owing to illness.",
    "The municipality commenced construction in 1990.", "She possesses considerable expertise in botany.",
    "The phenomenon was subsequently elucidated.", "They endeavoured to ameliorate the conditions.",
    "Precipitation is anticipated tomorrow afternoon.", "The edifice was demolished last year.",
    "The physician prescribed an antibiotic regimen.", "Attendance at the assembly is obligatory.",
    "The legislation was ratified unanimously.", "He purchased a substantial quantity of provisions.",
    "The vessel departed prior to dawn.", "Her remuneration was augmented considerably.",
    "The residents were evacuated as a precaution.", "The manuscript was meticulously scrutinised.",
]


def make_rows() -> list[dict]:
    rows = []
    for i, source in enumerate(SOURCES):
        messages = [{"role": "user", "content": source}]
        rows.append({"prompt_messages": json.dumps(messages) if i % 2 else messages,
                     "chosen": " ".join(source.split()[:4]) + ".", "rejected": source})
    return rows


def tiny_config(model_dir: str, **changes) -> TrainConfig:
    base = TrainConfig(model=model_dir, loss="arpo", num_workers=2, micro_batch_size=2, grad_accum=1, max_steps=4,
                       checkpoint_every=2, keep_checkpoints=2, max_failures=1, lr=1e-2, scheduler="constant",
                       lora=LoraSection(r=4, alpha=8), max_prompt_length=48, max_completion_length=24,
                       system_instruction=SYSTEM, deepspeed=DeepSpeedSection(zero_stage=2))
    return dataclasses.replace(base, **changes)


def lora_weights(adapter_dir: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))


def initial_lora_weights(model_dir: str, cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The adapter as the workers initialise it, rebuilt here with the loop's own builder and seed."""
    from peft import get_peft_model_state_dict

    from train.engine import build_lora_model

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(build_lora_model(model_dir, cfg)).items()}


def assert_trained_lora(result, model_dir: str, cfg: TrainConfig) -> None:
    assert math.isfinite(result.metrics["loss"]) and math.isfinite(result.metrics["grad_norm"])
    assert result.metrics["tokens_per_s"] > 0
    # the frozen base weights are bit-identical to the loaded ones on every worker
    assert result.metrics["base_drift"] == 0.0
    trained, initial = lora_weights(result.adapter_dir), initial_lora_weights(model_dir, cfg)
    assert trained.keys() == initial.keys() and trained and all("lora_" in k for k in trained)
    for name, before in initial.items():
        assert not torch.equal(trained[name], before), f"{name} did not change"
        if "lora_B" in name:  # peft starts B at zero, so a trained B is non-zero
            assert before.abs().max() == 0 and trained[name].abs().max() > 0


@pytest.fixture(scope="module")
def zero2_run(ray_local, tiny_model_dir, tmp_path_factory):
    cfg = tiny_config(tiny_model_dir, run_name="zero2", wandb=True)
    run_dir = tmp_path_factory.mktemp("zero2")
    return cfg, run_dir, run_training(cfg, make_rows(), make_rows()[:3], run_dir=str(run_dir))


def test_zero2_two_workers_train_lora_with_arpo(zero2_run, tiny_model_dir, ray_local):
    cfg, run_dir, result = zero2_run
    assert result.metrics["step"] == 4 and result.metrics["start_step"] == 0
    # where the workers ran, by rank: both on the session's one node (the fake multi-node test has them elsewhere)
    assert result.metrics["worker_nodes"] == [ray_local.get_runtime_context().get_node_id()] * 2
    assert_trained_lora(result, tiny_model_dir, cfg)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected",
                "arpo/penalty", "nll_loss", "lr", "eval/loss", "eval/rewards/margins"):
        assert math.isfinite(result.metrics[key]), key
    assert result.metrics["lr"] == pytest.approx(1e-2)
    # where the step time goes (bench.train_step prints it): each phase timed, within the step's wall time
    step_s = result.metrics["tokens"] / result.metrics["tokens_per_s"]  # log_every=1: the last report is step 4
    phases = [result.metrics[f"time/{name}_s"] for name in ("forward", "backward", "optimizer")]
    # rank 0's phases against rank 0's clock: parts of the step, never more than it
    assert all(t > 0 for t in phases) and sum(phases) < step_s
    assert 0 < result.metrics["time/allreduce_s"] < step_s
    assert result.adapter_dir == str(run_dir / "adapter")
    assert json.loads((run_dir / "adapter" / "adapter_config.json").read_text())["r"] == 4
    storage = Path(result.storage_dir)
    assert sorted(p.name for p in storage.glob("checkpoint_0*")) == ["checkpoint_000002", "checkpoint_000004"]
    assert [m["step"] for m in result.history] == [2, 4]
    step4 = storage / "checkpoint_000004"
    assert json.loads((step4 / "train_state.json").read_text()) == {"step": 4, "total_steps": 4}
    assert sorted(p.name for p in (step4 / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]
    assert sorted(p.name for p in (step4 / "deepspeed" / "step_4").iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    (run_file,) = find_run_files(storage / "wandb")  # rank 0 only, offline
    history = read_run(run_file)["history"]
    assert [row["step"] for row in history if "loss" in row] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def zero3_run(ray_local, tiny_model_dir, tmp_path_factory):
    # grad accumulation and left padding on top; 16 rows / global batch 8 = 2 steps per epoch, so 3 steps wrap.
    # fp32 on every CPU: the gradient-checkpointing run below is compared with this one where the sums' order is the
    # only difference (bf16-autocast, what "auto" picks on CPUs with native bf16, is trained by the ZeRO-2 run)
    cfg = tiny_config(tiny_model_dir, run_name="zero3", deepspeed=DeepSpeedSection(zero_stage=3), grad_accum=2,
                      max_steps=3, checkpoint_every=3, padding_side="left", precision="fp32")
    return cfg, run_training(cfg, make_rows(), run_dir=str(tmp_path_factory.mktemp("zero3")))


def test_zero3_two_workers_train_lora_with_arpo(zero3_run, tiny_model_dir):
    cfg, result = zero3_run
    assert result.metrics["step"] == 3
    assert_trained_lora(result, tiny_model_dir, cfg)
    step3 = Path(result.storage_dir) / "checkpoint_000003" / "deepspeed" / "step_3"
    # ZeRO-3 partitions the (LoRA) parameters themselves: one model-state shard per rank
    assert {p.name for p in step3.iterdir()} >= {"zero_pp_rank_0_mp_rank_00_model_states.pt",
                                                 "zero_pp_rank_1_mp_rank_00_model_states.pt"}


def test_failed_worker_resumes_from_checkpoint_and_ends_at_the_same_step(ray_local, tiny_model_dir, tmp_path,
                                                                         zero2_run):
    reference_cfg, _, reference = zero2_run
    # same run as the ZeRO-2 reference, but the last rank raises right after step 2 (its checkpoint) on attempt 1
    cfg = tiny_config(tiny_model_dir, run_name="resumed", fail_at_step=2, max_failures=1)
    result = run_training(cfg, make_rows(), make_rows()[:3], run_dir=str(tmp_path))
    assert result.metrics["step"] == reference.metrics["step"] == 4
    assert result.metrics["start_step"] == 2, "the restarted workers did not resume from the step-2 checkpoint"
    # same batches, optimizer state, LR schedule and dropout RNG as the uninterrupted run: the same operations on the
    # same shapes in the same order, so at any dtype the two agree to the last bit but for threads' reduction order
    assert result.metrics["loss"] == pytest.approx(reference.metrics["loss"], rel=1e-4)
    resumed, uninterrupted = lora_weights(result.adapter_dir), lora_weights(reference.adapter_dir)
    for name, weight in uninterrupted.items():
        torch.testing.assert_close(resumed[name], weight, rtol=1e-4, atol=1e-5)
    assert reference_cfg.fail_at_step == 0



def test_sft_overfits_one_batch_and_the_merged_adapter_writes_the_target_under_the_eval_prompt(
        ray_local, smollm2_dir, tmp_path):
    """The diagnosis paper 000's controls ask for, as a test: SFT on one example must drive the loss to ~0, and the
    evaluation path (hf engine, adapter merged, the policy's zero-shot template) must then decode that target.
    A wrong loss mask, a lost adapter or a train/eval prompt mismatch each fails here. SmolLM2, not the tiny random
    model: with a frozen random 64-wide body, LoRA plateaus at loss ~5.3 (in-process too), which says nothing."""
    from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
    from actors.engines.factory import build_engine
    from eval.prompts import load_template, prompt_path

    source, target = "The edifice was demolished last year.", "They tore the building down last year."
    messages = load_template(prompt_path("simplify_lexical_zeroshot")).render(input=source)
    rows = [{"prompt_messages": json.dumps(messages), "target": target}] * 2
    # measured in-process: loss 2.17 -> 0.02 after 5 steps and 0.001 after 10 at lr 3e-3. The one worker takes both
    # of the session cluster's CPUs (two threads): its eight steps are most of the test
    cfg = tiny_config(smollm2_dir, run_name="overfit", loss="sft", num_workers=1, cpus_per_worker=2,
                      micro_batch_size=2, max_steps=8, checkpoint_every=8, max_failures=0, lr=3e-3,
                      system_instruction="",
                      max_prompt_length=256, lora=LoraSection(r=8, alpha=16))
    result = run_training(cfg, rows, run_dir=str(tmp_path))
    assert result.metrics["step"] == 8
    assert result.metrics["loss"] < 0.05, f"one batch not memorised: loss {result.metrics['loss']:.3f}"

    sampling = SamplingParams(temperature=0.0, max_tokens=16)
    vanilla = build_engine(EngineSpec(kind="hf", model=smollm2_dir, num_threads=1))
    trained = build_engine(EngineSpec(kind="hf", model=smollm2_dir, num_threads=1, adapter=result.adapter_dir))
    before = vanilla.generate([ChatRequest(messages=messages, sampling=sampling)])[0].text
    after = trained.generate([ChatRequest(messages=messages, sampling=sampling)])[0].text
    assert before != target and after.strip() == target


def test_zero3_with_gradient_checkpointing_and_chunked_log_probs_trains_the_plain_runs_adapter(
        zero3_run, ray_local, tiny_model_dir, tmp_path):
    """The cluster configs' combination, against the plain ZeRO-3 run (same rows, steps and seed). ZeRO-3
    partitions each layer's weights again after its forward, so the layer recomputed in backward must not be held
    to the forward's parameter shapes (train.engine.build_lora_model); and the output head's weight is partitioned
    between calls, so each log-prob chunk's recomputation in backward must still see the gathered weight
    (train.engine.output_head). Recomputing changes no value: both runs must end at the same adapter."""
    plain_cfg, plain = zero3_run
    cfg = dataclasses.replace(plain_cfg, run_name="zero3-ckpt-chunk7", gradient_checkpointing=True,
                              logprob_chunk_tokens=7)
    result = run_training(cfg, make_rows(), run_dir=str(tmp_path))
    assert result.metrics["step"] == 3
    assert_trained_lora(result, tiny_model_dir, cfg)
    recomputed, full = lora_weights(result.adapter_dir), lora_weights(plain.adapter_dir)
    assert recomputed.keys() == full.keys() and full
    # The tolerance, from the dtype and the number of summed terms. Both runs compute the same values; recomputation
    # in backward and chunked log-probs only reorder floating-point sums, and a sum of n terms taken in another order
    # differs by at most n·u·Σ|terms| (Higham's γ_n; u the unit roundoff). Both runs are fp32 (u = 2^-24): the
    # longest reordered sum is a weight gradient over one micro-batch's tokens (n <= 2 rows x 72 = 144), so each
    # gradient moves by at most 144·2^-24 ≈ 8.6e-6 of its terms' magnitude. Adam's step lr·m̂/√v̂ is a ratio of such
    # sums, so its relative change is at most about twice that: over 3 steps at lr 1e-2 a weight moves by at most
    # 3·1e-2·1.7e-5 ≈ 5e-7 (for gradients not themselves within their rounding error of 0), below atol 1e-5 with a
    # factor of 20 and far below rtol 1e-3. The same rule at bf16 (u = 2^-8) gives 144·2^-8 > 0.5: no useful bound,
    # since autocast rounds each product's inputs to bf16, where a reordered fp32 sum can cross a rounding boundary
    # and move by a whole bf16 step (3.9e-3); on a CPU with AMX that moved one of 256 elements by 2.7e-5. Hence fp32.
    assert plain_cfg.precision == cfg.precision == "fp32"
    for name in full:
        torch.testing.assert_close(recomputed[name], full[name], rtol=1e-3, atol=1e-5)
