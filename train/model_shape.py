"""The shape of a Llama-style decoder that GPU memory depends on (`train.memory_budget`, `bench.gpu_check`): its
dimensions from an HF `config.json`, or from the known hub ids the cluster configs name. Pure: no torch."""

from __future__ import annotations

import dataclasses
import json
import os

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-style decoder (Llama, Qwen2/3, SmolLM2, Mistral) that memory depends on."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    @property
    def layer_params(self) -> int:
        """One decoder layer: its linears, two RMSNorms and Qwen3's q/k norms (counted for every model: tiny)."""
        return sum(i * o for i, o in self.linear_shapes().values()) + 2 * self.hidden + 2 * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def n_params(self) -> int:
        """All parameters; a tied output head shares the embedding's."""
        return self.embedding_params * (1 if self.tied else 2) + self.layers * self.layer_params + self.hidden

    def lora_params(self, r: int, targets: list[str] | str) -> int:
        """LoRA A and B of rank `r` on the named linears (`"all-linear"`: every linear but the output head, peft's
        meaning) of every layer: r * (in + out) each."""
        names = LINEARS if targets == "all-linear" else [t for t in targets if t in LINEARS]
        shapes = self.linear_shapes()
        return self.layers * sum(r * sum(shapes[name]) for name in names)

    def largest_param(self) -> int:
        """Elements of the largest single parameter (the embedding, or a linear's weight)."""
        return max(self.embedding_params, *(i * o for i, o in self.linear_shapes().values()))

    def persistent_params(self, threshold: int, r: int, targets: list[str] | str) -> int:
        """Elements of the parameters smaller than `threshold` (ZeRO-3 keeps them whole on every rank): the norms
        and the LoRA A (r x in) and B (out x r) matrices under it."""
        norms = [self.hidden, self.hidden, self.head_dim, self.head_dim]
        names = (LINEARS if targets == "all-linear" else [t for t in targets if t in LINEARS]) if r else []
        shapes = self.linear_shapes()
        lora = [n for name in names for n in (r * shapes[name][0], r * shapes[name][1])]
        per_layer = sum(n for n in norms + lora if n < threshold)
        return self.layers * per_layer + (self.hidden if self.hidden < threshold else 0)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def layer_activation_elements(self) -> int:
        """Activations one decoder layer saves for backward per token (fused attention: no T x T scores): the
        inputs of its two norms and seven linears, q, k, v, the attention output and the MLP's gate, up and act."""
        kv = self.kv_heads * self.head_dim
        return 6 * self.hidden + 2 * kv + 4 * self.intermediate


# config.json values of the models the cluster configs name by hub id (for a node that has not downloaded them)
KNOWN_MODELS = {
    "qwen3-0.6b": ModelShape(1024, 28, 3072, 16, 8, 128, 151936, True),
    "qwen3-1.7b": ModelShape(2048, 28, 6144, 16, 8, 128, 151936, True),
    "qwen3-4b": ModelShape(2560, 36, 9728, 32, 8, 128, 151936, True),
    "qwen3-8b": ModelShape(4096, 36, 12288, 32, 8, 128, 151936, False),
    "qwen3-14b": ModelShape(5120, 40, 17408, 40, 8, 128, 151936, False),
    "llama-3.1-8b-instruct": ModelShape(4096, 32, 14336, 32, 8, 128, 128256, False),
    "llama-3.3-70b-instruct": ModelShape(8192, 80, 28672, 64, 8, 128, 128256, False),
    "smollm2-135m": ModelShape(576, 30, 1536, 9, 3, 64, 49152, True),
    "smollm2-135m-instruct": ModelShape(576, 30, 1536, 9, 3, 64, 49152, True),
}


def shape_from_hf_config(config: dict) -> ModelShape:
    """A `ModelShape` from an HF `config.json` (Llama-style keys; missing kv heads / head_dim take HF's defaults)."""
    heads = int(config["num_attention_heads"])
    return ModelShape(
        hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]),
        intermediate=int(config["intermediate_size"]), heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        vocab=int(config["vocab_size"]), tied=bool(config.get("tie_word_embeddings", False)))


def model_shape(model: str) -> ModelShape | None:
    """The shape of a model spec: a local directory's config.json, else the last part of the path or hub id
    (``hf:Qwen/Qwen3-4B`` -> qwen3-4b) in `KNOWN_MODELS`; None when neither tells (the budget is then not checked)."""
    spec = model.removeprefix("hf:")
    path = os.path.join(os.path.expanduser(spec), "config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        try:
            return shape_from_hf_config(config)
        except (KeyError, TypeError, ValueError):
            return None
    return KNOWN_MODELS.get(spec.rstrip("/").rsplit("/", 1)[-1].lower())
