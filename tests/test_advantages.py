"""Hand-worked checks of the GRPO maths in train/grpo/advantages.py."""

from __future__ import annotations

import math

import pytest
import torch

from train.grpo.advantages import aggregate_token_losses, group_advantages, grpo_policy_loss, kl_penalty

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------------------------
# Advantages


def test_equal_rewards_give_zero_advantage():
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.7, -1.0, -1.0, -1.0, -1.0])
    for normalize_std in (True, False):
        assert torch.equal(group_advantages(rewards, 4, normalize_std), torch.zeros(8))


def test_group_of_four_hand_worked_sample_std():
    # rewards 0, 0, 0, 4: mean 1, deviations −1, −1, −1, 3, squares sum 1 + 1 + 1 + 9 = 12.
    # Sample (Bessel, as TRL's nanstd and verl's torch.std) variance 12/3 = 4 -> std 2 -> A = −0.5, −0.5, −0.5, 1.5.
    # (Population std would be sqrt(3) = 1.732 and give −0.577, not −0.5.)
    adv = group_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0]), group_size=4, eps=0.0)
    assert adv.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-7)
    with_eps = group_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0]), group_size=4)  # eps = 1e-6: 1.5·2/(2+1e-6)
    assert with_eps[3].item() == pytest.approx(3.0 / (2.0 + 1e-6), rel=1e-7)


def test_dr_grpo_only_centres():
    # Dr. GRPO: A = r − mean = −1, −1, −1, 3 (no std division)
    adv = group_advantages(torch.tensor([0.0, 0.0, 0.0, 4.0]), group_size=4, normalize_std=False)
    assert adv.tolist() == pytest.approx([-1.0, -1.0, -1.0, 3.0])


def test_groups_are_contiguous_blocks():
    # group 0 = (1, 3): mean 2, sample std sqrt(2) -> ∓1/sqrt(2); group 1 = (10, 10) -> 0, 0
    adv = group_advantages(torch.tensor([1.0, 3.0, 10.0, 10.0]), group_size=2, eps=0.0)
    assert adv.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0], abs=1e-6)


def test_group_of_one_gives_zero_not_nan_or_raw_score():
    adv = group_advantages(torch.tensor([3.0, -2.0, 0.5]), group_size=1)
    assert torch.equal(adv, torch.zeros(3))


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 4), group_size=4)


# ---------------------------------------------------------------------------------------------------------------
# KL estimators


def test_kl_estimators_hand_values():
    # logp = 0, ref = ln 2: log r = ln 2 = 0.693147, r = 2
    #   k1 = −ln 2 = −0.693147; k2 = ½·0.480453 = 0.240227; k3 = 2 − 0.693147 − 1 = 0.306853
    # logp = ln 2, ref = 0: log r = −ln 2, r = ½:  k3 = 0.5 + 0.693147 − 1 = 0.193147
    logps = torch.tensor([[0.0, LN2]])
    ref = torch.tensor([[LN2, 0.0]])
    assert kl_penalty(logps, ref, "k1")[0, 0].item() == pytest.approx(-0.693147, abs=1e-6)
    assert kl_penalty(logps, ref, "k2")[0, 0].item() == pytest.approx(0.240227, abs=1e-6)
    assert kl_penalty(logps, ref, "k3").tolist()[0] == pytest.approx([0.306853, 0.193147], abs=1e-6)


def test_k3_is_zero_at_equal_logps_and_never_negative():
    torch.manual_seed(0)
    logps = torch.randn(4, 9)
    assert torch.equal(kl_penalty(logps, logps, "k3"), torch.zeros(4, 9))
    assert (kl_penalty(logps, torch.randn(4, 9) * 3, "k3") >= 0).all()
    with pytest.raises(ValueError):
        kl_penalty(logps, logps, "k4")


# ---------------------------------------------------------------------------------------------------------------
# Policy loss and aggregation


def test_clip_binds_above_one_plus_eps_with_positive_advantage():
    # ratio = 1.5 > 1 + 0.2, A = +1: −min(1.5·1, 1.2·1) = −1.2 and the gradient is zero (clipped branch).
    logps = torch.full((1, 3), math.log(1.5), requires_grad=True)
    old = torch.zeros(1, 3)
    loss, metrics = grpo_policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 3))
    loss.backward()
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert torch.equal(logps.grad, torch.zeros(1, 3))
    assert metrics["clip_fraction"].item() == 1.0
    assert metrics["ratio_mean"].item() == pytest.approx(1.5, abs=1e-6)
    # approx KL(old‖new), k3 with r = new/old = 1.5: 1.5 − ln 1.5 − 1 = 0.094535
    assert metrics["approx_kl"].item() == pytest.approx(0.094535, abs=1e-6)


def test_no_clip_for_negative_advantage_at_high_ratio():
    # ratio 1.5, A = −1: −min(−1.5, −1.2) = 1.5; unclipped branch, d loss / d logp = −A·ratio = 1.5 per token,
    # divided by 3 tokens under token_mean = 0.5.
    logps = torch.full((1, 3), math.log(1.5), requires_grad=True)
    loss, metrics = grpo_policy_loss(logps, torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3))
    loss.backward()
    assert loss.item() == pytest.approx(1.5, abs=1e-6)
    torch.testing.assert_close(logps.grad, torch.full((1, 3), 0.5))
    assert metrics["clip_fraction"].item() == 0.0


def test_clip_higher_asymmetric_eps():
    # ratio 1.25 with ε_high = 0.28 (DAPO clip-higher) is inside the range, so not clipped: loss = −1.25
    logps = torch.full((1, 2), math.log(1.25))
    loss, metrics = grpo_policy_loss(logps, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.25, abs=1e-6) and metrics["clip_fraction"].item() == 0.0


def test_loss_aggregation_modes_hand_example():
    # ratio 1 everywhere so the per-token loss is −A: sequence 0 has A = 1 on 2 tokens -> −1, −1;
    # sequence 1 has A = −2 on 3 tokens -> 2, 2, 2. T = 3.
    #   token_mean:              (−1 − 1 + 2 + 2 + 2) / 5 = 0.8
    #   seq_mean_token_mean:     mean(−1, 2) = 0.5
    #   seq_mean_token_sum:      mean(−2, 6) = 2
    #   seq_mean_token_sum_norm: (−2 + 6) / (2 · 3) = 0.666667 (max_len = T); with max_len = 5: 4 / 10 = 0.4
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -2.0])
    expected = {"token_mean": 0.8, "seq_mean_token_mean": 0.5, "seq_mean_token_sum": 2.0}
    expected["seq_mean_token_sum_norm"] = 2 / 3
    for agg, value in expected.items():
        loss, _ = grpo_policy_loss(logps, logps, adv, mask, loss_agg=agg)
        assert loss.item() == pytest.approx(value, abs=1e-6), agg
    dr_grpo, _ = grpo_policy_loss(logps, logps, adv, mask, loss_agg="seq_mean_token_sum_norm", max_len=5)
    assert dr_grpo.item() == pytest.approx(0.4, abs=1e-6)
    with pytest.raises(ValueError):
        aggregate_token_losses(logps, mask, "sum")


def test_kl_term_is_added_before_aggregation():
    # logps = 0, ref = ln 2 on every token: k3 = 0.306853; ratio 1, A = 0 -> policy part 0.
    # kl_coef 0.1 -> loss = 0.0306853 under any aggregation that averages tokens.
    logps = torch.zeros(2, 3)
    ref = torch.full((2, 3), LN2)
    loss, metrics = grpo_policy_loss(logps, logps, torch.zeros(2), torch.ones(2, 3), ref_logps=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.0306853, abs=1e-6)
    assert metrics["kl"].item() == pytest.approx(0.306853, abs=1e-6)
    with pytest.raises(ValueError):
        grpo_policy_loss(logps, logps, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)


def test_per_token_advantages_are_accepted():
    # A per token: [[1, −1]] with ratio 1 -> per-token loss [−1, 1], token mean 0
    logps = torch.zeros(1, 2)
    loss, _ = grpo_policy_loss(logps, logps, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.0)
