"""Hand-worked checks of train/logprobs.py and train/preference/losses.py, plus parity with TRL's CPOTrainer loss."""

from __future__ import annotations

import math
import os
import types

import pytest
import torch
import torch.nn.functional as F

from train.config_sections import PreferenceLossConfig
from train.logprobs import sequence_logps, token_entropy, token_logps
from train.preference.losses import (
    arpo_loss,
    arpo_penalty,
    compute_nll,
    cpo_loss,
    cpo_simpo_loss,
    dpo_loss,
    sft_loss,
    simpo_loss,
)
from train.preference.objective import compute_preference_loss

LN2 = math.log(2.0)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------------------------------------------------------
# logprobs


def test_sequence_logps_shifts_by_one_and_masks():
    # V=2. logits[:, 0] = [0, 0] -> p = (1/2, 1/2) scores labels[:, 1] = 1: log(1/2).
    # logits[:, 1] = [ln 3, 0] -> p = (3/4, 1/4) scores labels[:, 2] = 0: log(3/4).
    # logits[:, 2] is never used (nothing follows it); labels[:, 0] is never scored.
    # sum = ln(3/8) = -0.980829, mean over 2 tokens = -0.490415.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [100.0, -100.0]]])
    labels = torch.tensor([[-100, 1, 0]])
    mask = torch.tensor([[0, 1, 1]])
    total, n = sequence_logps(logits, labels, mask)
    mean, _ = sequence_logps(logits, labels, mask, average=True)
    assert n.tolist() == [2]
    assert total.item() == pytest.approx(math.log(3 / 8), abs=1e-6)
    assert mean.item() == pytest.approx(math.log(3 / 8) / 2, abs=1e-6)


def test_sequence_logps_ignores_masked_labels_and_empty_rows_give_zero():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[1, 2, 3, 4], [0, -100, -100, -100]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    total, n = sequence_logps(logits, labels, mask)
    mean, _ = sequence_logps(logits, labels, mask, average=True)
    # row 0 scores labels 3 and 4 with logits rows 1 and 2
    expected = logits[0, 1].log_softmax(-1)[3] + logits[0, 2].log_softmax(-1)[4]
    assert n.tolist() == [2, 0]
    assert total[0].item() == pytest.approx(expected.item(), abs=1e-6)
    assert total[1].item() == 0.0 and mean[1].item() == 0.0


def test_token_logps_equals_log_softmax_gather():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 4
    labels = torch.randint(0, 11, (3, 5))
    naive = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logps(logits, labels), naive.float())


def test_token_entropy_uniform_and_peaked():
    # uniform over V=8: H = ln 8; a (nearly) one-hot distribution: H ~ 0
    logits = torch.stack([torch.zeros(8), torch.tensor([50.0] + [0.0] * 7)]).unsqueeze(0)
    entropy = token_entropy(logits)
    assert entropy[0, 0].item() == pytest.approx(math.log(8), abs=1e-6)
    assert entropy[0, 1].item() == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# DPO / CPO / SimPO / SFT


def test_dpo_is_ln2_when_policy_equals_reference():
    logps = t(-3.0, -10.5, -0.2)
    for smoothing in (0.0, 0.3):
        losses, metrics = dpo_loss(logps, logps - 1, logps, logps - 1, beta=0.1, label_smoothing=smoothing)
        torch.testing.assert_close(losses, torch.full((3,), LN2, dtype=torch.float64))
        assert metrics["rewards/margins"].item() == 0.0


def test_dpo_hand_value():
    # h = (-10 - -11) - (-12 - -11) = 1 - (-1) = 2; β·h = 0.2
    # L = -log σ(0.2) = softplus(-0.2) = ln(1 + e^-0.2) = 0.598139
    # ε = 0.1: 0.9·softplus(-0.2) + 0.1·softplus(0.2) = 0.9·0.598139 + 0.1·0.798139 = 0.618139
    losses, metrics = dpo_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), beta=0.1)
    assert losses.item() == pytest.approx(0.598139, abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(0.1)  # β·(−10 − −11)
    assert metrics["rewards/rejected"].item() == pytest.approx(-0.1)
    assert metrics["rewards/accuracies"].item() == 1.0
    smoothed, _ = dpo_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), beta=0.1, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.618139, abs=1e-6)


def test_cpo_hand_value_with_alpha():
    # ℓ_w − ℓ_l = −3 − (−5) = 2, β = 0.1: −log σ(0.2) = 0.598139; NLL 0.75
    # α = 1: 0.598139 + 0.75 = 1.348139; α = 0.5: 0.598139 + 0.375 = 0.973139
    losses, metrics = cpo_loss(t(-3.0), t(-5.0), t(0.75), beta=0.1, cpo_alpha=1.0)
    assert losses.item() == pytest.approx(1.348139, abs=1e-6)
    assert metrics["nll_loss"].item() == pytest.approx(0.75)
    half, _ = cpo_loss(t(-3.0), t(-5.0), t(0.75), beta=0.1, cpo_alpha=0.5)
    assert half.item() == pytest.approx(0.973139, abs=1e-6)


def test_simpo_margin_term():
    # β = 2, γ = 1 (γ/β = 0.5).
    # ℓ̄_w = −0.5, ℓ̄_l = −1.0: z = 0.5 − 0.5 = 0 -> ln 2.
    # ℓ̄_w = −0.4, ℓ̄_l = −1.2: z = 0.8 − 0.5 = 0.3, β·z = 0.6 -> softplus(−0.6) = ln(1 + e^−0.6) = 0.437488
    losses, metrics = simpo_loss(t(-0.5, -0.4), t(-1.0, -1.2), beta=2.0, gamma=1.0)
    assert losses.tolist() == pytest.approx([LN2, 0.437488], abs=1e-6)
    assert metrics["rewards/chosen"].item() == pytest.approx(2.0 * (-0.45))  # mean of β·ℓ̄_w


def test_cpo_simpo_adds_alpha_nll_to_simpo():
    # paper 000 knobs β = 0.1, γ = 1.5 (γ/β = 15): z = −0.4 − (−1.2) − 15 = −14.2, β·z = −1.42
    # L = softplus(1.42) + 1·0.6 = 1.628... + 0.6
    losses, _ = cpo_simpo_loss(t(-0.4), t(-1.2), t(0.6), beta=0.1, gamma=1.5, cpo_alpha=1.0)
    assert losses.item() == pytest.approx(softplus(1.42) + 0.6, abs=1e-9)


def test_compute_nll_reductions():
    # sums −6 (3 tokens) and −2 (1 token). token_mean: batch mean = 8/4 = 2, per example −ℓ_i·b/Σn = 3, 1
    # seq_mean: 6/3 = 2 and 2/1 = 2
    token = compute_nll(t(-6.0, -2.0), torch.tensor([3, 1]), "token_mean")
    seq = compute_nll(t(-6.0, -2.0), torch.tensor([3, 1]), "seq_mean")
    assert token.tolist() == pytest.approx([3.0, 1.0]) and token.mean().item() == pytest.approx(2.0)
    assert seq.tolist() == pytest.approx([2.0, 2.0])
    # sum (paper 002's Eq. 2, -log pi(w | H)): each example's summed NLL, 6 and 2
    assert compute_nll(t(-6.0, -2.0), torch.tensor([3, 1]), "sum").tolist() == pytest.approx([6.0, 2.0])
    with pytest.raises(ValueError):
        compute_nll(t(-1.0), torch.tensor([1]), "mean")


def test_eq2_nll_sum_is_the_sequence_log_likelihood_added_to_simpo():
    # paper 002 Eq. 2: L = SimPO - log pi(w | H); with nll_reduction "sum" the NLL term of CPO-SimPO is the summed
    # NLL per example (mean 4 over chosen sums -6 and -2), with token_mean the token-level mean (8 / 4 = 2)
    from train.config_sections import PreferenceLossConfig
    from train.preference.objective import compute_preference_loss

    stats = {"chosen_logps": t(-6.0, -2.0), "chosen_n_tokens": torch.tensor([3, 1]),
             "rejected_logps": t(-9.0, -4.0), "rejected_n_tokens": torch.tensor([3, 2])}
    loss = {r: compute_preference_loss("cpo_simpo", stats, PreferenceLossConfig(
        beta=2.5, simpo_gamma=1.375, cpo_alpha=1.0, nll_reduction=r))[0].item() for r in ("sum", "token_mean")}
    simpo = compute_preference_loss("simpo", stats, PreferenceLossConfig(beta=2.5, simpo_gamma=1.375))[0].item()
    assert loss["sum"] == pytest.approx(simpo + 4.0) and loss["token_mean"] == pytest.approx(simpo + 2.0)


def test_sft_loss_is_token_level_nll():
    # sums −6 over 3 tokens and −3 over 1 token: token mean = 9/4 = 2.25; seq mean = (2 + 3)/2 = 2.5
    losses, metrics = sft_loss(t(-6.0, -3.0), torch.tensor([3, 1]))
    assert losses.mean().item() == pytest.approx(2.25)
    assert metrics["n_tokens"].item() == 4
    seq, _ = sft_loss(t(-6.0, -3.0), torch.tensor([3, 1]), reduction="seq_mean")
    assert seq.mean().item() == pytest.approx(2.5)


# ---------------------------------------------------------------------------------------------------------------
# ARPO


def test_arpo_penalty_at_zero_gap_and_at_cap():
    # d = 0: 0.9·e^0 − 1 = −0.1. Cap at d ≥ ln(2/0.9)/0.4 = 0.798508/0.4 = 1.996269.
    # d = 2.5: 0.9·e^1 − 1 = 1.446454 -> clamped to 1.0. d = 1.99: 0.9·e^0.796 − 1 = 0.994... < 1
    penalty = arpo_penalty(t(0.0, 2.5, math.log(2 / 0.9) / 0.4, 1.99))
    assert penalty[0].item() == pytest.approx(-0.1, abs=1e-12)
    assert penalty[1].item() == 1.0
    assert penalty[2].item() == pytest.approx(1.0, abs=1e-12)
    assert penalty[3].item() < 1.0


def test_arpo_full_worked_example_clean():
    # chosen: sum −4 over 4 tokens -> ℓ̄_w = −1; rejected: sum −6 over 3 tokens -> ℓ̄_l = −2.
    # d = |−1 − (−2)| = 1; w = 0.9·e^0.4 − 1 = 0.9·1.491825 − 1 = 0.342642
    # z = ℓ̄_w − w·ℓ̄_l − γ/β = −1 + 0.685284 − 15 = −15.314716; β·z = −1.531472
    # pref = softplus(1.531472) = 1.727217; + α·NLL = 1·1.0 -> 2.727217
    losses, metrics = arpo_loss(t(-4.0), t(-6.0), torch.tensor([4]), torch.tensor([3]), t(1.0),
                                reproduce_double_normalisation=False)
    assert losses.item() == pytest.approx(2.727217, abs=1e-6)
    assert metrics["arpo/penalty"].item() == pytest.approx(0.342642, abs=1e-6)
    assert metrics["arpo/gap"].item() == pytest.approx(1.0)
    assert metrics["rewards/chosen"].item() == pytest.approx(-0.1)  # β·ℓ̄_w


def test_arpo_full_worked_example_double_normalisation():
    # Authors' quirk: d = |ℓ̄_w/n_w − ℓ̄_l/n_l| = |−1/4 + 2/3| = 0.416667
    # w = 0.9·e^(0.4·0.416667) − 1 = 0.9·1.181360 − 1 = 0.063224
    # z = −1 + 2·0.063224 − 15 = −15.873551; pref = softplus(1.587355) = 1.773391; + 1.0 -> 2.773391
    losses, metrics = arpo_loss(
        t(-4.0), t(-6.0), torch.tensor([4]), torch.tensor([3]), t(1.0), reproduce_double_normalisation=True
    )
    assert losses.item() == pytest.approx(2.773391, abs=1e-6)
    assert metrics["arpo/penalty"].item() == pytest.approx(0.063224, abs=1e-6)


def test_arpo_clamped_penalty_reduces_to_cpo_simpo_with_unit_weight():
    # ℓ̄_w = −0.5, ℓ̄_l = −3.0: d = 2.5 ≥ 1.996 -> w = 1, so z = ℓ̄_w − ℓ̄_l − γ/β: exactly CPO-SimPO.
    arpo, metrics = arpo_loss(t(-1.0), t(-9.0), torch.tensor([2]), torch.tensor([3]), t(0.5),
                              reproduce_double_normalisation=False)
    cpo_simpo, _ = cpo_simpo_loss(t(-0.5), t(-3.0), t(0.5), beta=0.1, gamma=1.5, cpo_alpha=1.0)
    assert metrics["arpo/penalty"].item() == 1.0
    assert arpo.item() == pytest.approx(cpo_simpo.item(), abs=1e-12)


def test_arpo_gradient_flows_through_penalty():
    # Same example as the clean worked example; a = s/n, d = a_w − a_l = 1 > 0, w unclamped.
    # dw/dd = c1·c2·e^(c2·d) = 0.9·0.4·1.491825 = 0.537057
    # dz/da_w = 1 − a_l·dw/dd = 1 + 2·0.537057 = 2.074114     (1 if the penalty were detached)
    # dz/da_l = −w + a_l·dw/dd = −0.342642 − 1.074114 = −1.416756   (−w if detached)
    # dL/dz = −β·σ(−β·z) with β·z = −1.531472; ds = da / n.
    s_w = torch.tensor([-4.0], dtype=torch.float64, requires_grad=True)
    s_l = torch.tensor([-6.0], dtype=torch.float64, requires_grad=True)
    losses, _ = arpo_loss(s_w, s_l, torch.tensor([4]), torch.tensor([3]), t(0.0), reproduce_double_normalisation=False)
    losses.sum().backward()
    w = 0.9 * math.exp(0.4) - 1
    dw_dd = 0.9 * 0.4 * math.exp(0.4)
    dl_dz = -0.1 / (1 + math.exp(-1.5314715544245714))  # −β·σ(−β·z), σ(1.531472) = 1/(1 + e^−1.531472)
    assert s_w.grad.item() == pytest.approx(dl_dz * (1 + 2 * dw_dd) / 4, rel=1e-9)
    assert s_l.grad.item() == pytest.approx(dl_dz * (-w - 2 * dw_dd) / 3, rel=1e-9)
    assert s_l.grad.item() != pytest.approx(dl_dz * (-w) / 3, rel=1e-3)  # the detached-penalty value


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def _stats(**values: list[float]) -> dict[str, torch.Tensor]:
    dtypes = {k: torch.int64 if k.endswith("n_tokens") else torch.float64 for k in values}
    return {k: torch.tensor(v, dtype=dtypes[k]) for k, v in values.items()}


def test_compute_preference_loss_dispatch_matches_direct_calls():
    stats = _stats(
        chosen_logps=[-4.0, -2.0],
        chosen_n_tokens=[4, 1],
        rejected_logps=[-6.0, -5.0],
        rejected_n_tokens=[3, 5],
        ref_chosen_logps=[-4.0, -2.0],
        ref_rejected_logps=[-6.0, -5.0],
    )
    cfg = PreferenceLossConfig()
    loss, metrics = compute_preference_loss("dpo", stats, cfg)
    assert loss.item() == pytest.approx(LN2)  # policy == reference
    # sft with token_mean: (4 + 2) / (4 + 1) = 1.2
    assert compute_preference_loss("sft", stats, cfg)[0].item() == pytest.approx(1.2)
    # arpo row 0 is the clean worked example (pref 1.727217); NLL token mean = 6/5 = 1.2 over the batch
    arpo, metrics = compute_preference_loss("arpo", stats, cfg)
    direct, _ = arpo_loss(t(-4.0), t(-6.0), torch.tensor([4]), torch.tensor([3]), t(0.0))
    direct_1, _ = arpo_loss(t(-2.0), t(-5.0), torch.tensor([1]), torch.tensor([5]), t(0.0))
    assert arpo.item() == pytest.approx((direct.item() + direct_1.item()) / 2 + 1.2, abs=1e-9)
    assert metrics["nll_loss"].item() == pytest.approx(1.2)
    # simpo ignores α; cpo_simpo = simpo + α·NLL
    simpo, _ = compute_preference_loss("simpo", stats, cfg)
    cpo_simpo, _ = compute_preference_loss("cpo_simpo", stats, cfg)
    assert cpo_simpo.item() == pytest.approx(simpo.item() + 1.2, abs=1e-9)
    cpo, _ = compute_preference_loss("cpo", stats, cfg)
    # cpo on sums: margins 2 and 3 -> (softplus(−0.2) + softplus(−0.3)) / 2 + 1.2
    assert cpo.item() == pytest.approx((softplus(-0.2) + softplus(-0.3)) / 2 + 1.2, abs=1e-9)
    with pytest.raises(ValueError):
        compute_preference_loss("ipo", stats, cfg)


def test_default_arpo_config_is_the_authors_double_normalised_gap():
    """Paper 000 ran the authors' code, whose SimPO path divides the averaged log-probs by the lengths again; the
    default reproduces it (2.773391, the worked example above), the plain gap (2.727217) is the knob."""
    stats = _stats(chosen_logps=[-4.0], chosen_n_tokens=[4], rejected_logps=[-6.0], rejected_n_tokens=[3])
    stats["chosen_nll"] = torch.tensor([1.0], dtype=torch.float64)
    paper, metrics = compute_preference_loss("arpo", stats, PreferenceLossConfig())
    # NLL (token mean) = 4/4 = 1.0, as in the worked example
    assert paper.item() == pytest.approx(2.773391, abs=1e-6)
    assert metrics["arpo/penalty"].item() == pytest.approx(0.063224, abs=1e-6)
    plain, _ = compute_preference_loss("arpo", stats, PreferenceLossConfig(reproduce_double_normalisation=False))
    assert plain.item() == pytest.approx(2.727217, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Parity with TRL's CPOTrainer (trl.experimental.cpo, TRL 1.16)


def _trl_cpo_trainer():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    return CPOTrainer


@pytest.mark.parametrize("loss_type", ["simpo", "sigmoid"])
def test_matches_trl_cpo_trainer_loss(loss_type):
    CPOTrainer = _trl_cpo_trainer()
    torch.manual_seed(3)
    b, T, V = 3, 7, 13
    logits = torch.randn(2 * b, T, V, dtype=torch.float64)
    input_ids = torch.randint(0, V, (2 * b, T))
    mask = torch.zeros(2 * b, T, dtype=torch.long)
    for row, prompt_len in enumerate([2, 3, 1, 4, 2, 5]):
        mask[row, prompt_len:] = 1
    mask[0, -1] = 0  # one padded row
    trl_labels = input_ids.masked_fill(mask == 0, -100)

    average = loss_type == "simpo"
    trl_logps = CPOTrainer.get_batch_logps(logits, trl_labels, average_log_prob=average)
    fake_self = types.SimpleNamespace(
        alpha=0.0,
        loss_type=loss_type,
        simpo_gamma=1.5,
        beta=0.1,
        label_smoothing=0.0,
        accelerator=types.SimpleNamespace(device="cpu"),
    )
    trl_losses, _, _ = CPOTrainer.cpo_loss(fake_self, trl_logps[:b], trl_logps[b:])
    # TRL's NLL: nn.CrossEntropyLoss over the shifted chosen labels (a token mean over the batch)
    trl_nll = F.cross_entropy(logits[:b, :-1].reshape(-1, V), trl_labels[:b, 1:].reshape(-1))
    trl_loss = trl_losses.mean() + 1.0 * trl_nll

    sums, n_tokens = sequence_logps(logits, input_ids, mask)
    avgs, _ = sequence_logps(logits, input_ids, mask, average=True)
    torch.testing.assert_close(avgs if average else sums, trl_logps.float())
    stats = {
        "chosen_logps": sums[:b],
        "chosen_n_tokens": n_tokens[:b],
        "rejected_logps": sums[b:],
        "rejected_n_tokens": n_tokens[b:],
    }
    name = "cpo_simpo" if loss_type == "simpo" else "cpo"
    ours, _ = compute_preference_loss(name, stats, PreferenceLossConfig(beta=0.1, simpo_gamma=1.5, cpo_alpha=1.0))
    assert ours.item() == pytest.approx(trl_loss.item(), abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# One LoRA step on a tiny Llama


def test_arpo_step_updates_lora_only():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    # init_lora_weights=False gives B ≠ 0: with peft's default B = 0 the first step leaves every A unchanged
    # (dL/dA is proportional to B), and we want to see every adapter matrix move.
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False
    )
    model = get_peft_model(LlamaForCausalLM(config), lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    prompt = torch.randint(0, 128, (2, 4))
    chosen = torch.cat([prompt, torch.randint(0, 128, (2, 5))], dim=1)
    rejected = torch.cat([prompt, torch.randint(0, 128, (2, 5))], dim=1)
    mask = torch.cat([torch.zeros(2, 4), torch.ones(2, 5)], dim=1).long()
    mask[1, -2:] = 0  # a shorter chosen/rejected pair, as after padding
    logits = model(input_ids=torch.cat([chosen, rejected])).logits
    sums, n_tokens = sequence_logps(logits, torch.cat([chosen, rejected]), torch.cat([mask, mask]))
    stats = {
        "chosen_logps": sums[:2],
        "chosen_n_tokens": n_tokens[:2],
        "rejected_logps": sums[2:],
        "rejected_n_tokens": n_tokens[2:],
    }
    loss, _ = compute_preference_loss("arpo", stats, PreferenceLossConfig())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss.backward()
    optimizer.step()

    lora_names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lora_names and all("lora_" in n for n in lora_names)
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert not torch.equal(param, before[name]), f"LoRA parameter {name} did not change"
        else:
            assert torch.equal(param, before[name]), f"base parameter {name} changed"
