"""Token sampling shared by the families' generate loops."""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator) -> int:
    """Index into ``logits`` [N]: argmax when ``temperature <= 0``, else top-k sampling (all of them when
    ``top_k`` is None or 0), drawn from ``generator`` so a seed fixes the result."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / temperature
    if top_k and top_k < scaled.numel():
        values, indices = torch.topk(scaled, top_k)
        pick = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return int(indices[pick])
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))


def process(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None,
            repetition_penalty: float | None = None, seen: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` [N] as transformers' ``generate`` processes them before it samples, in its order: the repetition
    penalty of the indices in ``seen`` (a logit divided by it, a negative one multiplied), the temperature, top-k
    (ties with the k-th kept), top-p (the smallest set of indices whose probability reaches ``top_p``); what is
    filtered out is -inf. float32 [N]."""
    scores = logits.float().clone()
    if repetition_penalty is not None and repetition_penalty != 1.0 and seen is not None and seen.numel():
        ids = torch.unique(seen)
        picked = scores[ids]
        scores[ids] = torch.where(picked < 0, picked * repetition_penalty, picked / repetition_penalty)
    scores = scores / temperature
    if top_k and top_k < scores.numel():
        scores = scores.masked_fill(scores < torch.topk(scores, top_k).values[-1], float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[-1] = False  # the most likely index always stays
        scores = scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return scores


def sample_processed(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                     repetition_penalty: float | None, seen: torch.Tensor | None, generator: torch.Generator) -> int:
    """Index into ``logits`` [N] drawn from ``generator`` after :func:`process` (argmax of the penalised logits
    when ``temperature <= 0``, as transformers' greedy search with a repetition penalty)."""
    if temperature <= 0:
        return int(torch.argmax(process(logits, 1.0, None, None, repetition_penalty, seen)))
    probs = torch.softmax(process(logits, temperature, top_k, top_p, repetition_penalty, seen), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
