"""Chunked log-probs (train/logprobs.py `chunked_token_logps`, the GRPO loop's default): the same values and
gradients as the full-logits path, without ever holding the (b, T, V) logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from train.config import GRPOConfig, TrainConfig
from train.logprobs import chunked_token_logps, token_entropy, token_logps


def _full(hidden, head, labels):
    logits = head(hidden)
    return token_logps(logits, labels), token_entropy(logits)


@pytest.mark.parametrize("chunk", [1, 3, 7, 24, 1000])
def test_values_and_gradients_equal_the_full_logits(chunk):
    torch.manual_seed(0)
    b, t, h, v = 2, 12, 16, 50
    head = torch.nn.Linear(h, v, bias=False)
    hidden = torch.randn(b, t, h, requires_grad=True)
    labels = torch.randint(0, v, (b, t))
    weights = torch.randn(b, t)  # any downstream use of both outputs

    ref_logps, ref_entropy = _full(hidden, head, labels)
    ((ref_logps * weights).sum() + ref_entropy.sum()).backward()
    ref_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    logps, entropy = chunked_token_logps(hidden, head, labels, chunk, with_entropy=True)
    ((logps * weights).sum() + entropy.sum()).backward()
    torch.testing.assert_close(logps, ref_logps)
    torch.testing.assert_close(entropy, ref_entropy)
    torch.testing.assert_close(hidden.grad, ref_grads[0])
    torch.testing.assert_close(head.weight.grad, ref_grads[1])


def test_autograd_keeps_no_logits():
    """Every tensor saved for backward is smaller than one chunk of logits: the chunks are recomputed."""
    torch.manual_seed(0)
    b, t, h, v, chunk = 2, 64, 8, 512, 16
    head = torch.nn.Linear(h, v, bias=False)
    hidden = torch.randn(b, t, h, requires_grad=True)
    labels = torch.randint(0, v, (b, t))
    saved: list[int] = []

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logps, _ = chunked_token_logps(hidden, head, labels, chunk)
    chunked_saved, saved[:] = sum(saved), []
    assert chunked_saved < 4 * b * t * (h + 1)  # hidden chunks, labels and per-token outputs only
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logps(head(hidden), labels)
    assert sum(saved) >= b * t * v  # the full path keeps every row of logits for backward
    logps.sum().backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_no_grad_and_bad_arguments():
    head = torch.nn.Linear(4, 9)
    hidden, labels = torch.randn(1, 5, 4), torch.randint(0, 9, (1, 5))
    with torch.no_grad():
        logps, entropy = chunked_token_logps(hidden, head, labels, 2)
    torch.testing.assert_close(logps, token_logps(head(hidden), labels))
    assert entropy is None and not logps.requires_grad
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logps(hidden, head, labels, 0)
    with pytest.raises(ValueError, match="disagree"):
        chunked_token_logps(hidden, head, labels[:, :3], 2)


class _Engine:
    """What the GRPO loop reads of a DeepSpeed engine: forward, `.module`, `.device`."""

    def __init__(self, model):
        self.module, self.device = model, torch.device("cpu")

    def __call__(self, **kwargs):
        return self.module(**kwargs)


def test_the_grpo_loss_on_a_real_model_is_the_same_chunked_or_not(tiny_model_dir):
    """Policy, reference (adapter off) and entropy of the GRPO loop's micro-batch, and the LoRA gradients."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from train.grpo.micro import micro_loss, policy_logps
    from train.sequences import collate_sequences

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    with torch.no_grad():  # a trained-looking adapter: B != 0, so the reference differs and A gets gradient
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    engine = _Engine(model)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15]]
    completions = [[20, 21, 22], [23, 24, 25, 26, 27], [28], [29, 30]]
    batch = collate_sequences(prompts, completions, 0, "left")
    part, advantages, valid = slice(0, 4), torch.tensor([1.0, -0.5, 0.3, -0.8]), torch.ones(4, dtype=torch.bool)
    full = GRPOConfig(precision="fp32", logprob_chunk_tokens=0, entropy_coef=0.01, kl_coef=0.1)
    chunked = dataclasses.replace(full, logprob_chunk_tokens=3)

    results = []
    for cfg in (full, chunked):
        model.zero_grad()
        ref = policy_logps(engine, batch, part, cfg, no_grad=True, reference=True)[0]
        old = policy_logps(engine, batch, part, cfg, no_grad=True)[0]
        logps, mask, entropy = policy_logps(engine, batch, part, cfg, entropy=True)
        loss, metrics = micro_loss(engine, cfg, batch, part, advantages, valid, old, ref)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((ref, old, logps.detach(), mask, entropy.detach(), loss.detach(), metrics, grads))
    (ref_a, old_a, lp_a, mask_a, ent_a, loss_a, met_a, grads_a), (ref_b, old_b, lp_b, mask_b, ent_b, loss_b, met_b,
                                                                  grads_b) = results
    assert torch.equal(mask_a, mask_b) and int(mask_a.sum()) == 11
    for a, b in ((ref_a, ref_b), (old_a, old_b), (lp_a, lp_b), (ent_a, ent_b), (loss_a, loss_b)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref_a, lp_a)  # the reference really ran without the adapter
    assert met_a.keys() == met_b.keys() and met_a["entropy_wsum"] == pytest.approx(met_b["entropy_wsum"], rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 8
    for name in grads_a:
        assert grads_a[name].abs().sum() > 0, name
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-3, atol=1e-6)  # summation order


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_chunks_hold_less_cuda_memory_than_full_logits():
    """bf16 on the GPU: the same values within bf16 rounding, a fraction of the full path's peak memory."""
    torch.manual_seed(0)
    b, t, h, v = 4, 1024, 512, 32000
    head = torch.nn.Linear(h, v, bias=False, device="cuda", dtype=torch.bfloat16)
    hidden = torch.randn(b, t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (b, t), device="cuda")
    peaks, values = [], []
    for run in ("full", "chunked"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if run == "full":
            logps = token_logps(head(hidden), labels)
        else:
            logps, _ = chunked_token_logps(hidden, head, labels, 512)
        logps.sum().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        values.append((logps.detach(), hidden.grad.clone()))
        hidden.grad = None
    torch.testing.assert_close(values[0][0], values[1][0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(values[0][1], values[1][1], rtol=5e-2, atol=5e-3)
    assert peaks[1] < peaks[0] / 4, peaks  # full: (b, t, v) bf16 logits + their gradient (~0.5 GiB)


def test_the_preference_trainer_s_log_probs_are_the_same_chunked_or_not(tiny_model_dir):
    """`train.preference.loop._logps` (every preference loss and SFT): summed log-probs, token counts and LoRA gradients."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from train.preference.loop import _logps
    from train.sequences import collate_sequences

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    engine = _Engine(model)
    batch = collate_sequences([[5, 6, 7], [8], [9, 10, 11, 12]], [[20, 21], [22, 23, 24, 25], [26]], 0, "right")
    weights = torch.tensor([1.0, -2.0, 0.5])
    results = []
    for chunk in (0, 5):
        cfg = TrainConfig(precision="fp32", logprob_chunk_tokens=chunk)
        model.zero_grad()
        logps, n_tokens = _logps(engine, batch, cfg)
        (logps * weights).sum().backward()
        with torch.no_grad():
            no_grad_logps, _ = _logps(engine, batch, cfg)
        results.append((logps.detach(), n_tokens, no_grad_logps,
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    (full, n_full, ng_full, g_full), (chunked, n_chunked, ng_chunked, g_chunked) = results
    assert n_full.tolist() == n_chunked.tolist() == [2, 4, 1]
    torch.testing.assert_close(full, chunked, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ng_full, ng_chunked, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full, ng_full, rtol=1e-5, atol=1e-5)
    for name in g_full:
        torch.testing.assert_close(g_full[name], g_chunked[name], rtol=1e-3, atol=1e-6)  # summation order


def test_a_model_whose_last_hidden_state_is_not_normed_is_refused():
    from types import SimpleNamespace

    from train.logprobs import final_hidden

    engine = SimpleNamespace(module=SimpleNamespace(config=SimpleNamespace(tie_last_hidden_states=False)))
    with pytest.raises(ValueError, match="logprob_chunk_tokens: 0"):
        final_hidden(engine, {}, grad=True)
