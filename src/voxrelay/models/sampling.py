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
