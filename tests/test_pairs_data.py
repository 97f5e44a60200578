"""train/sequences.py on SmolLM2's real tokenizer and chat template: prompts, masks, truncation, padding, plan."""

from __future__ import annotations

import json

import pytest
import torch

from train.logprobs import sequence_logps
from train.sequences import (
    collate_pairs,
    collate_targets,
    encode_pair,
    encode_target,
    parse_messages,
    plan_total_steps,
    render_prompt,
    response_text,
    step_row_indices,
    steps_per_epoch,
)

SYSTEM = "Rewrite the sentence in simpler words."
SOURCE = "The municipality commenced construction of the edifice in 1990."
ROW = {"prompt_messages": [{"role": "user", "content": SOURCE}],
       "chosen": "The town started building it in 1990.", "rejected": "The city began construction in 1990."}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------------------------
# Messages and templates


def test_parse_messages_accepts_list_json_and_plain_string():
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SOURCE}]
    assert parse_messages(messages) == messages
    assert parse_messages(json.dumps(messages)) == messages
    assert parse_messages(SOURCE) == [{"role": "user", "content": SOURCE}]
    with pytest.raises(ValueError, match="role"):
        parse_messages([{"content": "no role"}])
    assert response_text([{"role": "assistant", "content": "short"}]) == "short"


def test_prompt_has_system_instruction_user_source_and_assistant_header(tokenizer):
    text = render_prompt(tokenizer, ROW["prompt_messages"], system_instruction=SYSTEM)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{SOURCE}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # a row that brings its own system turn keeps it; the instruction is not added twice
    own = [{"role": "system", "content": "Own."}, {"role": "user", "content": SOURCE}]
    assert render_prompt(tokenizer, own, system_instruction=SYSTEM).count("<|im_start|>system") == 1
    assert "Own." in render_prompt(tokenizer, own, system_instruction=SYSTEM)


def test_template_without_system_role_merges_instruction_into_user_turn(tokenizer):
    strict = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = render_prompt(strict, [{"role": "user", "content": SOURCE}], system_instruction=SYSTEM)
    assert text == f"<user>{SYSTEM}\n\n{SOURCE}</s><assistant>"


# ---------------------------------------------------------------------------------------------------------------
# Encoding, masking, truncation


def test_completion_is_the_assistant_turn_up_to_end_of_turn(tokenizer):
    pair = encode_pair(tokenizer, ROW, max_prompt_length=512, max_completion_length=512, system_instruction=SYSTEM)
    assert decode(tokenizer, pair.prompt_ids) == render_prompt(tokenizer, ROW["prompt_messages"], SYSTEM)
    assert decode(tokenizer, pair.chosen_ids) == ROW["chosen"] + "<|im_end|>"
    assert decode(tokenizer, pair.rejected_ids) == ROW["rejected"] + "<|im_end|>"
    # TRL's conversational response format gives the same tokens
    conversational = dict(ROW, chosen=[{"role": "assistant", "content": ROW["chosen"]}])
    assert encode_pair(tokenizer, conversational, 512, 512, SYSTEM).chosen_ids == pair.chosen_ids


def test_loss_mask_covers_exactly_the_completion_tokens(tokenizer):
    pair = encode_pair(tokenizer, ROW, 512, 512, SYSTEM)
    batch = collate_pairs([pair], pad_id=tokenizer.pad_token_id)
    n_prompt, n_chosen, n_rejected = len(pair.prompt_ids), len(pair.chosen_ids), len(pair.rejected_ids)
    chosen_mask, rejected_mask = batch["loss_mask"][0].tolist(), batch["loss_mask"][1].tolist()
    assert chosen_mask[:n_prompt] == [0] * n_prompt
    assert chosen_mask[n_prompt:n_prompt + n_chosen] == [1] * n_chosen
    assert sum(chosen_mask) == n_chosen and sum(rejected_mask) == n_rejected
    # the ids under the mask are the completion's, and sequence_logps counts exactly those tokens
    assert batch["input_ids"][0][batch["loss_mask"][0].bool()].tolist() == pair.chosen_ids
    logits = torch.zeros(*batch["input_ids"].shape, len(tokenizer))
    _, n_tokens = sequence_logps(logits, batch["input_ids"], batch["loss_mask"])
    assert n_tokens.tolist() == [n_chosen, n_rejected]


def test_prompt_keeps_its_end_and_completion_keeps_its_start(tokenizer):
    long_row = dict(ROW, prompt_messages=[{"role": "user", "content": "word " * 300 + SOURCE}],
                    chosen="simple " * 100, rejected="Ok.")
    pair = encode_pair(tokenizer, long_row, max_prompt_length=20, max_completion_length=7, system_instruction=SYSTEM)
    full_prompt = encode_pair(tokenizer, long_row, 10_000, 10_000, SYSTEM).prompt_ids
    assert len(pair.prompt_ids) == 20 and pair.prompt_ids == full_prompt[-20:]
    assert decode(tokenizer, pair.prompt_ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert len(pair.chosen_ids) == 7
    assert decode(tokenizer, pair.chosen_ids) == "simple " * 6 + "simple"
    # a short completion is untouched by the limit
    assert decode(tokenizer, pair.rejected_ids) == "Ok.<|im_end|>"


def test_sft_rows_encode_the_target(tokenizer):
    row = {"prompt_messages": ROW["prompt_messages"], "target": "A short answer."}
    target = encode_target(tokenizer, row, 512, 512, SYSTEM)
    batch = collate_targets([target, target], pad_id=tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 2
    assert batch["input_ids"][0][batch["loss_mask"][0].bool()].tolist() == target.target_ids
    assert decode(tokenizer, target.target_ids) == "A short answer.<|im_end|>"


# ---------------------------------------------------------------------------------------------------------------
# Padding


def test_right_and_left_padding_hold_the_same_tokens_and_positions(tokenizer):
    short = dict(ROW, chosen="Ok.", rejected="Fine.")
    pairs = [encode_pair(tokenizer, r, 512, 512, SYSTEM) for r in (ROW, short)]
    right = collate_pairs(pairs, pad_id=tokenizer.pad_token_id, padding_side="right")
    left = collate_pairs(pairs, pad_id=tokenizer.pad_token_id, padding_side="left")
    assert right["input_ids"].shape == left["input_ids"].shape == (4, right["attention_mask"].sum(-1).max())
    for r_row, l_row in zip(right["attention_mask"].bool(), left["attention_mask"].bool()):
        assert r_row.sum() == l_row.sum()
    real_right = [ids[m.bool()].tolist() for ids, m in zip(right["input_ids"], right["attention_mask"])]
    real_left = [ids[m.bool()].tolist() for ids, m in zip(left["input_ids"], left["attention_mask"])]
    assert real_right == real_left
    # the short chosen row (row 1) is padded at the end on the right, at the start on the left
    n_real = int(right["attention_mask"][1].sum())
    assert right["attention_mask"][1, n_real:].sum() == 0 and left["attention_mask"][1, :-n_real].sum() == 0
    assert (right["input_ids"][1, n_real:] == tokenizer.pad_token_id).all()
    assert (right["loss_mask"] <= right["attention_mask"]).all() and (left["loss_mask"] <= left["attention_mask"]).all()
    # positions count real tokens only: 0..n-1 on both sides
    assert right["position_ids"][1, :n_real].tolist() == list(range(n_real))
    assert left["position_ids"][1, -n_real:].tolist() == list(range(n_real))


def test_left_and_right_padding_give_the_same_log_probs(tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    short = dict(ROW, chosen="Ok.", rejected="Fine.")
    pairs = [encode_pair(tokenizer, r, 512, 512, SYSTEM) for r in (ROW, short)]
    results = []
    for side in ("right", "left"):
        batch = collate_pairs(pairs, pad_id=tokenizer.pad_token_id, padding_side=side)
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
        results.append(sequence_logps(logits, batch["input_ids"], batch["loss_mask"]))
    (right_logps, right_n), (left_logps, left_n) = results
    assert right_n.tolist() == left_n.tolist()
    torch.testing.assert_close(right_logps, left_logps, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Batch plan


def test_step_plan_splits_each_global_batch_disjointly_and_reshuffles_per_epoch():
    n_rows, micro, accum, world = 20, 2, 2, 2  # global batch 8 -> 2 steps per epoch, 4 rows dropped
    assert steps_per_epoch(n_rows, 8) == 2
    for step in range(2):
        parts = [idx for rank in range(world) for idx in step_row_indices(step, n_rows, micro, accum, world, rank, 7)]
        flat = [i for part in parts for i in part]
        assert len(parts) == world * accum and all(len(p) == micro for p in parts)
        assert len(set(flat)) == 8
    epoch0 = {i for s in range(2) for r in range(world) for p in step_row_indices(s, n_rows, micro, accum, world, r, 7)
              for i in p}
    assert len(epoch0) == 16  # the two steps of an epoch never repeat a row
    assert step_row_indices(2, n_rows, micro, accum, world, 0, 7) != step_row_indices(0, n_rows, micro, accum, world,
                                                                                      0, 7)
    assert step_row_indices(3, n_rows, micro, accum, world, 1, 7) == step_row_indices(3, n_rows, micro, accum, world,
                                                                                      1, 7)


def test_total_steps_from_epochs_or_max_steps():
    assert plan_total_steps(n_rows=100, global_batch=8, epochs=2) == 24
    assert plan_total_steps(n_rows=100, global_batch=8, epochs=2, max_steps=5) == 5
    with pytest.raises(ValueError, match="global batch of 128"):
        plan_total_steps(n_rows=100, global_batch=128, epochs=1)
