"""The llama.cpp side of `bench.generate`: engine selection, batch admission, stopping, the FLOP count from a
config, the note printed when llama-cpp-python is missing, and (when it is installed) real batched decoding."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from bench.engines import parse_engines
from bench.llamacpp import Sequence, admit, record_token, same_text_count
from bench.roofline import config_shapes, useful_flops


def test_engines_are_parsed_in_order_and_unknown_names_rejected():
    assert parse_engines("hf,llamacpp") == ["hf", "llamacpp"]
    assert parse_engines(" llamacpp ,hf,llamacpp") == ["llamacpp", "hf"]
    for bad in ("", "hf,vllm", " , "):
        with pytest.raises(ValueError, match="--engines"):
            parse_engines(bad)


def test_admission_fills_free_slots_within_the_token_budget():
    # 3 free slots, prompts of 70, 60, 50 tokens; 130 of room holds the first two (70 + 60), not the third
    assert admit([70, 60, 50], free_slots=3, budget=130) == 2
    assert admit([70, 60, 50], free_slots=3, budget=180) == 3
    assert admit([70, 60, 50], free_slots=1, budget=1000) == 1
    assert admit([70, 60, 50], free_slots=0, budget=1000) == 0
    # order is kept: a short prompt behind one that does not fit waits too
    assert admit([300, 10], free_slots=2, budget=200) == 0


def test_a_sequence_stops_at_eos_which_it_keeps_or_at_max_tokens():
    eos = frozenset({2})
    seq = Sequence(prompt=[5, 6], max_tokens=3)
    assert not record_token(seq, 7, eos)
    assert record_token(seq, 2, eos)
    assert (seq.tokens, seq.finish_reason) == ([7, 2], "stop")
    seq = Sequence(prompt=[5], max_tokens=2)
    assert not record_token(seq, 7, eos)
    assert record_token(seq, 8, eos)
    assert (seq.tokens, seq.finish_reason) == ([7, 8], "length")
    # EOS on the last allowed token is a stop, not a length cut
    seq = Sequence(prompt=[5], max_tokens=1)
    assert record_token(seq, 2, eos) and seq.finish_reason == "stop"


def test_smollm2_flops_from_its_config():
    config = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                             intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)
    # per layer: q + o 2*576*576 = 663,552; k + v 2*576*192 = 221,184; MLP 3*576*1536 = 2,654,208 -> 3,538,944;
    # x 30 = 106,168,320; LM head 576 * 49,152 = 28,311,552
    assert config_shapes(config) == (134_479_872, 30, 576)
    # two completions: (prompt 4, 2 tokens): contexts 4 + 5 = 9; (prompt 1, 1 token): context 1 -> 10 in all
    expected = 2 * 134_479_872 * 3 + 4 * 30 * 576 * 10
    assert useful_flops(134_479_872, 30, 576, [(4, 2), (1, 1)]) == expected
    # no head_dim in the config: hidden / heads
    del config.head_dim
    assert config_shapes(config) == (134_479_872, 30, 576)


def test_same_text_count_compares_position_by_position():
    assert same_text_count(["a", "b"], ["b", "a"]) == 0
    with pytest.raises(ValueError):
        same_text_count(["a"], ["a", "b"])


def test_bench_without_llama_cpp_says_how_to_install_it(monkeypatch, capsys):
    from bench import generate

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    generate.main(["--engines", "llamacpp"])
    out = capsys.readouterr().out
    assert "info llamacpp not measured: llama_cpp is not installed: pip install 'quorum[llamacpp]'" in out
    assert "bench " not in out
    with pytest.raises(SystemExit):
        generate.main(["--engines", "hf,vllm"])


def test_llamacpp_decodes_several_sequences_as_it_decodes_each_alone(smollm2_dir):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (optional extra 'llamacpp')")
    from transformers import AutoTokenizer

    from actors.engines.hf.engine import render_prompt
    from bench.llamacpp import LlamaCppDecoder, find_gguf

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    texts = ("Simplify: the committee postponed its decision.", "What is two plus two?", "Name a colour.")
    prompts = [tokenizer(render_prompt(tokenizer, [{"role": "user", "content": t}], False),
                         add_special_tokens=False).input_ids for t in texts]
    eos, context = frozenset({tokenizer.eos_token_id}), max(len(p) for p in prompts) + 6
    gguf = find_gguf("smollm2-135m", "")
    # 2 slots for 3 prompts: the third is admitted when the first sequence to end frees its slot
    batched = LlamaCppDecoder(gguf, threads=1, max_batch_size=2, context=context)
    together = batched.generate(prompts, 6, eos)
    alone = LlamaCppDecoder(gguf, threads=1, max_batch_size=1, context=context)
    one_by_one = alone.generate(prompts, 6, eos)
    assert [s.tokens for s in together] == [s.tokens for s in one_by_one]
    for seq in together:
        assert 1 <= len(seq.tokens) <= 6
        assert seq.finish_reason == ("stop" if seq.tokens[-1] in eos else "length")
    assert tokenizer.decode(together[1].tokens, skip_special_tokens=True).strip()
    with pytest.raises(ValueError, match="exceeds the slot"):
        alone.generate(prompts, 7, eos)
    batched.close()
    alone.close()
