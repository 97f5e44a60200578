"""int8 linear layers for the hf engine on CPUs without native bf16 (`engine.quantize: int8`, a declared option).

Why: at float32 the demo's judge stages are compute-bound (long prompts prefilled in 64-row batches; linear layers
about half of a forward), and a CPU without bf16 has no faster float format. x86 CPUs with AVX512-VNNI or AVX-VNNI
(most Intel since Cascade Lake / Alder Lake, AMD since Zen 4) multiply int8 by int8 natively: on 2 idle cores of the
benchmarks page's machine SmolLM2's projection shapes ran 1.3-2.8x faster than float32's prepacked ones at 64 to
1,024 rows (the rounding and rescaling included), and `python -m bench.int8` measures the engine on the demo's work.

What it computes: dynamic quantisation with a scale per token, as torchao's int8 dynamic-activation, int8-weight
configuration does. Each weight row (output channel) is rounded once to int8 with its own scale (max |w| / 127);
each input row (token) is rounded to int8 per call with its own scale (max |x| / 127); the product is int8 x int8
summed in int32 (`torch._int_mm`, torch's int8 matrix product; exact, checked against float64 sums) and rescaled to
float32. A scale per token matters: SmolLM2's hidden states have outlier channels, and one scale for a whole batch
(`quantize_dynamic`'s, torch.ao's deprecated path) rounds ordinary tokens to a few levels: greedy answers changed
("The capital of France is Paris." became "L'Alma, la France, la France.") where per-token scales kept them. A row's
result also does not depend on which other rows share its batch. The decoder layers' projections are quantised; the
LM head stays float32 (prepacked), so next-token scores are computed at full precision from int8-projected hidden
states.

This changes outputs: greedy tokens can differ from float32's where two tokens are nearly tied. It is off by
default; what it did to the demo's verdicts is measured on the benchmarks page. A model's first quantised layer is
probed against its float32 product within the bound int8 rounding allows (`int8_close`) before any is swapped, so a
kernel that computes something else is refused at load.
"""

from __future__ import annotations

import torch

# int8 symmetric on both sides: a row's step is its max |value| / 127
_LEVEL = 127


def int8_available() -> bool:
    """Whether this torch build multiplies int8 matrices on CPU (`torch._int_mm`), checked on a 2 x 8 x 8 product."""
    try:
        ones = torch.ones(2, 8, dtype=torch.int8)
        return bool((torch._int_mm(ones, ones.t().contiguous()) == 8).all())
    except (AttributeError, RuntimeError):
        return False


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of a 2-D float tensor as int8 and its float32 step (max |row| / 127; an all-zero row gets a tiny one)."""
    step = x.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / _LEVEL
    return torch.round(x / step).clamp_(-_LEVEL, _LEVEL).to(torch.int8), step


class Int8Linear(torch.nn.Module):
    """Inference-only stand-in for a float32 nn.Linear: int8 weights per output channel, inputs per token.

    The float weight is not kept: the module holds the int8 weight (transposed for the kernel) and its steps.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        if linear.weight.dtype != torch.float32:
            raise ValueError(f"Int8Linear: needs a float32 layer, got {linear.weight.dtype}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        qweight, step = quantize_rows(linear.weight.detach())
        self.weight_t = qweight.t().contiguous()  # (in, out): the layout torch._int_mm reads fastest on CPU
        self.weight_step = step.reshape(-1)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        qx, step = quantize_rows(rows)
        out = torch._int_mm(qx, self.weight_t).to(torch.float32).mul_(step).mul_(self.weight_step)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The most an int8 product (`Int8Linear`) may differ from F.linear(x, weight), per output element (float64).

    With a token's step a_t (max |x_t| / 127) and a row's step w_j (max |W_j| / 127), rounding moves each input by at
    most a_t/2 and each weight by at most w_j/2, so the product's error is at most
    a_t/2 * sum_i |W_ji| + w_j/2 * sum_i |x_ti| + K * a_t/2 * w_j/2, plus float32 rounding of the rescaled sum.
    """
    x64, w64 = x.double(), weight.detach().double()
    a = x64.abs().amax(dim=-1, keepdim=True) / _LEVEL
    w_step = w64.abs().amax(dim=1) / _LEVEL
    k = w64.shape[1]
    bound = (a / 2) * w64.abs().sum(dim=1) + x64.abs().sum(dim=-1, keepdim=True) * (w_step / 2) + k * (a / 2) * (w_step / 2)
    return bound + 16 * torch.finfo(torch.float32).eps * (x64.abs() @ w64.abs().T)


def int8_close(x: torch.Tensor, weight: torch.Tensor, plain: torch.Tensor, quantized: torch.Tensor) -> bool:
    """Whether `quantized` is F.linear(x, weight)'s `plain` within int8 rounding (`int8_bound`) element by element."""
    return bool(((plain.double() - quantized.double()).abs() <= int8_bound(x, weight)).all())


def layer_matches(linear: torch.nn.Linear, quantized: torch.nn.Module, rows: int) -> bool:
    """Probe one layer on a decode-shaped and a prefill-shaped input: its int8 product stays within `int8_close`."""
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for shape in ((rows, 1), (2, 37)):
            x = torch.randn(*shape, linear.in_features, generator=generator)
            if not int8_close(x, linear.weight, linear(x), quantized(x)):
                return False
    return True


def quantize_linear_layers(model: torch.nn.Module, rows: int) -> int:
    """Swap every float32 nn.Linear of `model` except its output embeddings (the LM head) for an Int8Linear.

    The first layer is probed (`layer_matches`) before any is swapped.

    Returns:
        How many layers were swapped.

    Raises:
        ValueError: this torch has no quantized CPU ops, or the probe's products fall outside int8 rounding.
    """
    if not int8_available():
        raise ValueError("engine.quantize: int8 needs torch._int_mm on CPU, which this torch build lacks or refuses")
    head = model.get_output_embeddings()
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, torch.nn.Linear) and child is not head]
    if not targets:
        return 0
    probe = targets[0][2]
    if not layer_matches(probe, Int8Linear(probe), rows):
        raise ValueError("engine.quantize: int8 products of this torch build fall outside int8 rounding of float32's "
                         "on a probe layer; run without engine.quantize")
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)
