"""HFEngine on real (tiny) models: batching, greedy parity with `generate`, stops, thinking, sampling, errors.

Most tests use a 2-layer random Llama with SmolLM2's tokenizer (float32, so batch composition cannot change a
greedy token); the thinking test uses a 1-layer model whose weights are set by hand so that it always answers
`<think>plan</think>Yes`; two tests run the real SmolLM2.

`QUORUM_TEST_DEVICE=cuda` runs the same tests on a GPU (engine and reference model alike; float32 there too, so
the parity checks stay exact); `tests/test_hf_engine_cuda.py` does that under `-m gpu`. The oneDNN packing
test is CPU-only and stays there.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.engines.base import ChatRequest, EngineSpec, SamplingParams
from actors.engines.hf.engine import HFEngine, collect_eos_ids, merge_system_into_user, render_prompt
from actors.engines.hf.token_sampling import sample_token
from actors.engines.hf.weights import PackedLinear
from actors.models import build_tiny_random_model, resolve_model_dir
from tests.engine_prompts import PROMPTS

DEVICE = os.environ.get("QUORUM_TEST_DEVICE", "cpu")

# A template in the style of Gemma's: no system role, it raises instead.
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared, busy 2-core machine an OpenMP barrier
    waiting for a descheduled thread made these tests 20x slower. Restored afterwards for other test files."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_random_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir) -> HFEngine:
    engine = HFEngine(EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, max_batch_size=4))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory) -> str:
    return build_scripted_model(tmp_path_factory.mktemp("scripted"), ["<think>", "plan", "</think>", "Yes"])


def build_scripted_model(out_dir: Path, script: list[str]) -> str:
    """A 1-layer Llama that, after any chat prompt, greedily emits the tokens of `script` then EOS.

    The decoder layer's output projections are zeroed, so the final hidden state is the (normalised) embedding
    of the current token; the untied LM head maps each token's embedding onto its successor in the script,
    a bigram table. `<think>` / `</think>` are added to the tokenizer so that every script token is unique.
    """
    build_tiny_random_model(out_dir, layers=1, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.add_tokens(["<think>", "</think>"])
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, tie_word_embeddings=False)
    model.resize_token_embeddings(len(tokenizer))
    chain = [tokenizer("\n", add_special_tokens=False).input_ids[-1]]  # generation prompt ends with "\n"
    chain += [tokenizer.convert_tokens_to_ids(token) for token in script] + [tokenizer.eos_token_id]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        head = torch.zeros(len(tokenizer), embeddings.shape[1])
        for current, following in itertools.pairwise(chain):
            head[following] += 20 * embeddings[current] / embeddings[current].norm()
        model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def ask(text: str, **sampling) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": text}], SamplingParams(**sampling))


# ---------------------------------------------------------------------------------------------------------------
# Batching and greedy parity


def test_batched_greedy_equals_one_at_a_time(tiny_engine):
    # Different lengths make rows finish at different steps, so freed slots are refilled mid-flight and old
    # and new rows (different KV columns) decode side by side.
    requests = [ask(p, max_tokens=4 + 3 * i) for i, p in enumerate(PROMPTS)]
    batched = tiny_engine.generate(requests)
    for request, together in zip(requests, batched):
        [alone] = tiny_engine.generate([request])
        assert together.raw_text == alone.raw_text
        assert together.completion_tokens == alone.completion_tokens
    # Six prompts through four slots exercise refilling; different prompts must not collapse to one answer.
    assert len({c.raw_text for c in batched}) > 1


def test_greedy_equals_model_generate_on_tiny_model(tiny_engine, tiny_model_dir):
    # the reference is the unmodified model: the engine's own is fused and prepacked on CPU, float32 included
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(DEVICE).eval()
    completions = tiny_engine.generate([ask(p, max_tokens=12) for p in PROMPTS[:3]])
    for prompt, completion in zip(PROMPTS[:3], completions):
        reference = reference_greedy(tiny_engine.tokenizer, plain, prompt, max_new_tokens=12)
        assert completion.raw_text == reference


def reference_greedy(tokenizer, model, prompt: str, max_new_tokens: int) -> str:
    """What plain `model.generate(do_sample=False)` answers, decoded like the engine decodes."""
    text = render_prompt(tokenizer, [{"role": "user", "content": prompt}], thinking=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    new = [t for t in out[0, ids.shape[1] :].tolist() if t not in collect_eos_ids(model, tokenizer)]
    return tokenizer.decode(new, skip_special_tokens=True)


def test_packed_bf16_engine_equals_model_generate(tiny_model_dir):
    engine = HFEngine(EngineSpec(model=tiny_model_dir, dtype="bfloat16", device="cpu", num_threads=1))
    if not engine.packed_layers:
        pytest.skip("oneDNN packed linear unavailable in this torch build")
    assert isinstance(engine.model.lm_head, PackedLinear)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    [completion] = engine.generate([ask(PROMPTS[1], max_tokens=12)])
    assert completion.raw_text == reference_greedy(engine.tokenizer, plain, PROMPTS[1], max_new_tokens=12)


def test_lora_adapter_is_merged_and_answers_like_the_peft_model(tiny_model_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(5)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora).save_pretrained(tmp_path / "adapter")
    spec = EngineSpec(model=tiny_model_dir, dtype="float32", device=DEVICE, adapter=str(tmp_path / "adapter"))
    tuned, base = HFEngine(spec), HFEngine(dataclasses.replace(spec, adapter=""))
    requests = [ask(p, max_tokens=10) for p in PROMPTS[:3]]
    tuned_texts = [c.raw_text for c in tuned.generate(requests)]
    assert tuned_texts != [c.raw_text for c in base.generate(requests)]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "adapter")
    peft_model = peft_model.to(DEVICE).eval()
    references = [reference_greedy(tuned.tokenizer, peft_model, p, max_new_tokens=10) for p in PROMPTS[:3]]
    assert tuned_texts == references


def test_adapter_that_is_not_a_peft_directory_is_named(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="engine.adapter"):
        HFEngine(EngineSpec(model=tiny_model_dir, adapter=str(tmp_path)))


def test_prefill_split_into_row_chunks_gives_the_same_tokens(tiny_engine):
    requests = [ask(p, max_tokens=6 + i) for i, p in enumerate(PROMPTS)]
    whole = tiny_engine.generate(requests)
    budget = tiny_engine.settings.prefill_token_budget
    try:  # one row per prefill forward (any width exceeds a budget of 1 token)
        tiny_engine.settings = dataclasses.replace(tiny_engine.settings, prefill_token_budget=1)
        chunked = tiny_engine.generate(requests)
    finally:
        tiny_engine.settings = dataclasses.replace(tiny_engine.settings, prefill_token_budget=budget)
    assert [c.raw_text for c in chunked] == [c.raw_text for c in whole]
    assert [c.completion_tokens for c in chunked] == [c.completion_tokens for c in whole]


# ---------------------------------------------------------------------------------------------------------------
# Lengths, stops, counts


def test_max_tokens_ends_with_length_and_counts_tokens(tiny_engine):
    [completion] = tiny_engine.generate([ask(PROMPTS[0], max_tokens=7)])
    rendered = render_prompt(tiny_engine.tokenizer, [{"role": "user", "content": PROMPTS[0]}], thinking=False)
    assert completion.finish_reason == "length"
    assert completion.completion_tokens == 7
    assert completion.prompt_tokens == len(tiny_engine.tokenizer(rendered, add_special_tokens=False).input_ids)
    assert completion.text


def test_stop_string_cuts_the_text(tiny_engine):
    [full] = tiny_engine.generate([ask(PROMPTS[1], max_tokens=16)])
    stop = full.raw_text[len(full.raw_text) // 2 :][:3]
    [stopped] = tiny_engine.generate([ask(PROMPTS[1], max_tokens=16, stop=(stop, "never-there"))])
    assert stopped.finish_reason == "stop"
    assert stopped.raw_text == full.raw_text[: full.raw_text.find(stop)]
    assert stopped.completion_tokens < 16


def test_thinking_is_split_from_the_answer(thinking_model_dir):
    engine = HFEngine(EngineSpec(model=thinking_model_dir, dtype="float32", device=DEVICE, thinking=True))
    [completion, cut] = engine.generate([ask("Is water wet?", max_tokens=20), ask("Is water wet?", max_tokens=2)])
    assert completion.raw_text == "<think>plan</think>Yes"
    assert (completion.text, completion.reasoning) == ("Yes", "plan")
    # four script tokens + EOS, which ends the completion as "stop"
    assert (completion.completion_tokens, completion.finish_reason) == (5, "stop")
    # cut off while thinking: no answer, the partial thought is reasoning
    assert (cut.text, cut.reasoning, cut.finish_reason) == ("", "plan", "length")


# ---------------------------------------------------------------------------------------------------------------
# Sampling


def test_seeded_sampling_does_not_depend_on_batch(tiny_engine):
    sampled = ask(PROMPTS[3], max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    [alone] = tiny_engine.generate([sampled])
    together = tiny_engine.generate([ask(PROMPTS[0], max_tokens=5), sampled, ask(PROMPTS[2], temperature=0.7)])
    assert together[1].raw_text == alone.raw_text
    [other_seed] = tiny_engine.generate([ask(PROMPTS[3], max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=8)])
    assert other_seed.raw_text != alone.raw_text


def test_top_k_and_top_p_cut_the_tail():
    # softmax([3, 2, 1, 0]) = [0.644, 0.237, 0.087, 0.032]
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    generator = torch.Generator().manual_seed(0)

    def draws(**params) -> set[int]:
        return {int(sample_token(logits, SamplingParams(temperature=1.0, **params), generator)) for _ in range(400)}

    assert draws(top_k=2) == {0, 1}
    # token 1 is kept (mass ranked above it, 0.644, is under 0.8); token 2 is not (0.881 above it)
    assert draws(top_p=0.8) == {0, 1}
    assert draws() == {0, 1, 2, 3}


# ---------------------------------------------------------------------------------------------------------------
# Templates


def test_system_turn_is_merged_when_the_template_rejects_it(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "no-system"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(NO_SYSTEM_TEMPLATE)
    engine = HFEngine(EngineSpec(model=str(model_dir), dtype="float32", device=DEVICE))
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}]
    [completion] = engine.generate([ChatRequest(messages, SamplingParams(max_tokens=3))])
    merged = "<|im_start|>user\nAnswer briefly.\n\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(engine.tokenizer, messages, thinking=False) == merged
    assert completion.prompt_tokens == len(engine.tokenizer(merged, add_special_tokens=False).input_ids)


def test_merge_system_into_user():
    sys_user = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}]
    assert merge_system_into_user(sys_user) == [
        {"role": "user", "content": "S\n\nU1"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "U2"},
    ]
    assert sys_user[0] == {"role": "system", "content": "S"}  # input not mutated
    no_sys = [{"role": "user", "content": "U"}]
    assert merge_system_into_user(no_sys) == no_sys
    assert merge_system_into_user([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    # a system turn anywhere (a request from any client) joins the first user turn too
    assert merge_system_into_user([{"role": "user", "content": "U"}, {"role": "system", "content": "S"}]) == [
        {"role": "user", "content": "S\n\nU"}]


# ---------------------------------------------------------------------------------------------------------------
# Errors


def test_bad_spec_fields_are_named(tiny_model_dir):
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(EngineSpec(model=tiny_model_dir, max_batch_size=0))
    with pytest.raises(ValueError, match="engine.dtype"):
        HFEngine(EngineSpec(model=tiny_model_dir, dtype="float8"))
    with pytest.raises(ValueError, match="/no/such/model"):
        HFEngine(EngineSpec(model="/no/such/model"))


def test_bad_requests_are_named(tiny_engine):
    with pytest.raises(ValueError, match=r"requests\[1\]\.messages\[0\]\.content"):
        tiny_engine.generate([ask("fine"), ChatRequest([{"role": "user"}])])
    with pytest.raises(ValueError, match=r"requests\[0\]\.sampling\.temperature"):
        tiny_engine.generate([ask("x", temperature=-1.0)])


def test_prompt_longer_than_context_is_an_error_completion(tiny_engine):
    [completion] = tiny_engine.generate([ask("word " * 9000)])  # past the tiny model's 8192 positions
    assert completion.finish_reason == "error"
    assert "context" in completion.error


# ---------------------------------------------------------------------------------------------------------------
# The real SmolLM2


@pytest.mark.slow
def test_smollm2_chat_completion_matches_generate():
    engine = HFEngine(EngineSpec(model=resolve_model_dir("smollm2-135m"), dtype="float32", device=DEVICE))
    prompts = ["What is the capital of France?", "Simplify: The committee postponed its decision."]
    completions = engine.generate([ask(p, max_tokens=24) for p in prompts])
    # the unmodified model, not the engine's fused and prepacked one (tests/test_hf_fast_path.py pins more prompts)
    plain = AutoModelForCausalLM.from_pretrained(resolve_model_dir("smollm2-135m"), dtype=torch.float32)
    plain = plain.to(DEVICE).eval()
    for prompt, completion in zip(prompts, completions):
        assert completion.text.strip()
        assert completion.raw_text == reference_greedy(engine.tokenizer, plain, prompt, max_new_tokens=24)
    assert "Paris" in completions[0].text
    engine.close()


# ---------------------------------------------------------------------------------------------------------------
# Grammar-constrained decoding (actors.engines.hf.constrained)


def test_grammar_keeps_the_models_choice_where_it_is_allowed_and_overrides_it_where_not(thinking_model_dir):
    engine = HFEngine(EngineSpec(model=thinking_model_dir, dtype="float32", device=DEVICE, max_batch_size=4))
    free = 'start: "<think>" reasoning "</think>" ("Yes" | "No")\nreasoning[max_tokens=4]: /[^<]*/\n'
    forced = 'start: "<think>" reasoning "</think>" "No"\nreasoning[max_tokens=4]: /[^<]*/\n'
    done = engine.generate([ask("Go?", max_tokens=16, grammar=free), ask("Go?", max_tokens=16, grammar=forced),
                            ask("Go?", max_tokens=16)])
    # the script's own answer is allowed by the first grammar, so greedy decoding keeps it
    assert (done[0].raw_text, done[0].text, done[0].reasoning) == ("<think>plan</think>Yes", "Yes", "plan")
    assert (done[1].text, done[1].reasoning, done[1].finish_reason) == ("No", "plan", "stop")
    # an unconstrained row of the same batch is untouched by its neighbours' masks
    assert done[2].raw_text == "<think>plan</think>Yes"
    engine.close()


def test_thinking_judge_reasons_freely_then_gives_a_constrained_score(thinking_model_dir):
    from eval.judging.grammar import score_grammar
    from eval.judging.parse import parse_score

    engine = HFEngine(EngineSpec(model=thinking_model_dir, dtype="float32", device=DEVICE, thinking=True))
    [done] = engine.generate([ask("Rate it.", max_tokens=64, grammar=score_grammar(64, thinking=True))])
    assert done.reasoning == "plan" and done.finish_reason == "stop"
    assert parse_score(done.raw_text).ok and done.completion_tokens <= 64
    engine.close()


def test_constrained_rows_parse_in_a_mixed_batch_and_a_bad_grammar_fails_alone(tiny_engine):
    from eval.judging.grammar import best_worst_grammar
    from eval.judging.parse import parse_best_worst

    grammar = best_worst_grammar(4, 48)
    plain = [ask(p, max_tokens=12) for p in PROMPTS[:2]]
    alone = tiny_engine.generate(plain)
    done = tiny_engine.generate([ask(PROMPTS[2], max_tokens=48, grammar=grammar), plain[0],
                                 ask(PROMPTS[3], max_tokens=48, temperature=1.0, seed=5, grammar=grammar), plain[1],
                                 ask(PROMPTS[4], max_tokens=48, grammar="start: no_such_rule\n")])
    for completion in (done[0], done[2]):
        verdicts = parse_best_worst(completion.raw_text, 4)
        assert all(not v["error"] for v in verdicts.values()), completion.raw_text
        assert completion.finish_reason == "stop" and completion.completion_tokens <= 48
    assert [done[1].raw_text, done[3].raw_text] == [c.raw_text for c in alone]
    assert done[4].finish_reason == "error" and "sampling.grammar" in done[4].error
