"""Parler-TTS' token layout: the delay pattern over K codebooks, labels, decoder inputs and the loss rule.

Codes are DAC codes int [K, T] with values ``0..codebook_size-1`` (1024 for Parler's DAC). Two special
ids sit above them: EOS = PAD = ``codebook_size`` (1024) and BOS = ``codebook_size + 1`` (1025, also the
decoder start id). Codebook k is delayed by k steps, as upstream's ``build_delay_pattern_mask`` applied
in ``run_parler_tts_training.py`` does. For K = 3, T = 2 (B = BOS, E = EOS = PAD)::

    labels [K, T+K]      decoder inputs [K, T+K]    loss targets
    a0 a1 E  E  E        B  a0 a1 E  E              a0 a1 E  .  .
    B  b0 b1 E  E        B  B  b0 b1 E              .  b0 b1 E  .
    B  B  c0 c1 E        B  B  B  c0 c1             .  .  c0 c1 E

Upstream stores labels as rows [K, T+K]; its collator transposes them to [B, L, K] and pads with -100.
Decoder inputs are the labels shifted right by one step with BOS in front and -100 read as PAD, so
padding becomes EOS inputs. The loss ignores BOS labels and every position whose *input* is already EOS:
each codebook learns its T codes and exactly one EOS.

Generated rows [K, N] start with the all-BOS start column; :func:`undelay` keeps, as upstream's
``generate`` does, slots ``k+1 .. k+N-K`` of codebook k and then drops every frame holding a special id.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

EOS_ID = 1024
"""EOS and PAD of Parler's decoder (= the DAC codebook size)."""
BOS_ID = 1025
"""BOS of each codebook row and the decoder start id."""
IGNORE_INDEX = -100
"""Label padding of the collator (ignored by the loss)."""


def delay_labels(codes: torch.Tensor, bos: int = BOS_ID, eos: int = EOS_ID) -> torch.Tensor:
    """Training labels of one utterance: codes int [K, T] -> int64 [K, T+K].

    Row k holds k BOS, the T codes of codebook k, then EOS (K-k times: the first is the target, the
    others are PAD, which has the same id). Upstream returns all-EOS rows when T < K-2 (its
    ``build_delay_pattern_mask`` skips short inputs); this keeps the pattern for every T >= 1.
    """
    if codes.dim() != 2 or codes.shape[1] < 1:
        raise ValueError(f"codes must be [K, T] with T >= 1 frames, got shape {tuple(codes.shape)}")
    num_codebooks, frames = codes.shape
    slot = torch.arange(frames + num_codebooks, device=codes.device)
    frame = slot[None, :] - torch.arange(num_codebooks, device=codes.device)[:, None]  # [K, T+K]
    gathered = codes.long().gather(1, frame.clamp(0, frames - 1))
    labels = torch.where(frame < frames, gathered, torch.full_like(gathered, eos))
    return torch.where(frame < 0, torch.full_like(gathered, bos), labels)


def collate_labels(rows: Sequence[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """Batch label rows [K, L_i] into int64 [B, L, K] padded with -100 (upstream's collator).

    ``length`` pads further to a fixed L (upstream's ``padding="max_length"``).
    """
    columns = [row.long().transpose(0, 1) for row in rows]
    labels = torch.nn.utils.rnn.pad_sequence(columns, batch_first=True, padding_value=IGNORE_INDEX)
    if length is not None and length > labels.shape[1]:
        labels = F.pad(labels, (0, 0, 0, length - labels.shape[1]), value=IGNORE_INDEX)
    return labels


def decoder_inputs(labels: torch.Tensor, bos: int = BOS_ID, eos: int = EOS_ID) -> torch.Tensor:
    """Teacher-forcing inputs: labels [B, L, K] -> int64 [B, L, K].

    Upstream's ``shift_tokens_right(labels, pad_token_id=1024, decoder_start_token_id=1025)``: one
    step to the right, BOS first, -100 replaced by PAD (= EOS).
    """
    shifted = torch.full_like(labels, bos, dtype=torch.long)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, eos)


def loss_targets(labels: torch.Tensor, bos: int = BOS_ID, eos: int = EOS_ID) -> torch.Tensor:
    """Labels [B, L, K] with everything the loss ignores set to -100 (upstream's masking rule).

    Ignored: padding, BOS labels, and positions whose decoder input is EOS (so only the first EOS of
    each codebook is a target).
    """
    inputs = decoder_inputs(labels, bos, eos)
    ignored = (labels == IGNORE_INDEX) | (labels == bos) | (inputs == eos)
    return labels.long().masked_fill(ignored, IGNORE_INDEX)


def codebook_losses(
    logits: torch.Tensor, labels: torch.Tensor, bos: int = BOS_ID, eos: int = EOS_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-codebook cross-entropy sums (float32 [K]) and target counts (int64 [K]).

    logits: [B, K, L, V] (audio positions only, as :meth:`ParlerModule.forward` returns them);
    labels: [B, L, K]. Upstream's loss is the mean over codebooks of ``sums / counts`` (see
    :func:`mean_of_means`); the sums are returned so a trainer can normalise over a whole step.
    Logits are upcast per codebook so bf16 training still gets a float32 softmax.
    """
    targets = loss_targets(labels, bos, eos)
    vocab = logits.shape[-1]
    sums = [
        F.cross_entropy(
            logits[:, k].reshape(-1, vocab).float(),
            targets[..., k].reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        for k in range(logits.shape[1])
    ]
    counts = (targets != IGNORE_INDEX).sum(dim=(0, 1))
    return torch.stack(sums), counts


def mean_of_means(
    sums: torch.Tensor, counts: torch.Tensor, codebook_weights: Sequence[float] | None = None
) -> torch.Tensor:
    """Upstream's reported loss: each codebook's mean CE, averaged (or weighted by ``codebook_weights``)."""
    per_codebook = sums / counts.to(sums.dtype)
    if codebook_weights is None:
        return per_codebook.mean()
    weights = torch.as_tensor(codebook_weights, dtype=sums.dtype, device=sums.device)
    return (per_codebook * weights).sum() / weights.sum()


def undelay(rows: torch.Tensor, codebook_size: int = EOS_ID) -> torch.Tensor:
    """Codes of one generated sequence: delayed rows [K, N] (start column first) -> int64 [K, T].

    As upstream's ``generate``: codebook k contributes slots ``k+1 .. k+N-K`` (N-K each), then every
    frame where some codebook holds an id >= ``codebook_size`` (BOS, EOS/PAD, unused vocab) is dropped.
    ``undelay(cat([BOS column, delay_labels(codes)], 1))`` gives ``codes`` back.
    """
    num_codebooks, length = rows.shape
    width = length - num_codebooks
    if width <= 0:
        return rows.new_zeros((num_codebooks, 0), dtype=torch.long)
    slot = torch.arange(width, device=rows.device)[None, :] + torch.arange(1, num_codebooks + 1, device=rows.device)[
        :, None
    ]
    frames = rows.long().gather(1, slot)  # [K, N-K]
    keep = (frames < codebook_size).all(dim=0)
    return frames[:, keep]


def undelay_batch(rows: torch.Tensor, codebook_size: int = EOS_ID) -> list[torch.Tensor]:
    """:func:`undelay` per sample: rows [B, K, N] -> B tensors int64 [K, T_b] (lengths differ)."""
    return [undelay(sample, codebook_size) for sample in rows]
