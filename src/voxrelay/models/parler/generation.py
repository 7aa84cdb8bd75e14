"""Parler-TTS generation: sampling over the delayed codebooks with a KV cache, upstream's rules.

Rules kept from upstream's ``generate`` (transformers 4.46 ``_sample`` + ``ParlerTTSLogitsProcessor``):

- rows start with one all-BOS column; slot j of codebook k is forced to BOS while j <= k (codebook k
  cannot start before step k) and to PAD when j >= k + max_length - K + 1; the model's sample is used
  elsewhere. ``max_length`` counts the start column;
- EOS is banned for every codebook during the first ``min_new_tokens`` (default K + 1) new steps;
- once the first unfinished codebook of a sample has an EOS, the next one may emit EOS (at most one
  codebook further per step): codebooks above the first unfinished one never emit EOS;
- a codebook row that emitted EOS is finished and continues with PAD (= EOS); generation stops when
  every row is finished or ``max_length`` columns exist;
- scores: float32 logits, EOS bans, then temperature and top-k (upstream's default top_k is 50), then a
  multinomial draw (or argmax when ``do_sample`` is False).

The self-attention cache grows by one position per step; cross-attention keys are computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from voxrelay.models.parler.delay import BOS_ID, EOS_ID, undelay_batch
from voxrelay.models.parler.modeling import Conditioning, ParlerModule

FREE = -1
"""Pattern value of a slot the model fills."""


@dataclass
class LayerCache:
    """One layer's cached keys/values [B, H_kv, S, Dh]: self-attention grows, cross-attention is set once."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    cross_keys: torch.Tensor | None = None
    cross_values: torch.Tensor | None = None


@dataclass
class DecoderCache:
    """KV cache of every decoder layer; ``length`` = positions already seen (prompt + audio steps)."""

    layers: list[LayerCache]
    length: int = 0

    @classmethod
    def empty(cls, num_layers: int) -> DecoderCache:
        return cls([LayerCache() for _ in range(num_layers)])


@dataclass(frozen=True)
class SamplingConfig:
    """How to draw codes (defaults: upstream's generation config for mini-v1)."""

    do_sample: bool = True  # False: greedy (argmax after the EOS rules)
    temperature: float = 1.0
    top_k: int | None = 50  # transformers 4.46's default, which upstream's sampling uses
    max_length: int = 2580  # decoder columns incl. the start column: 30 s at 86 Hz
    min_new_tokens: int | None = None  # EOS banned for this many new steps; None: K + 1 (upstream eval), 0: off
    seed: int | None = None  # seeds a private torch.Generator (None: the global RNG)

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; use do_sample=False for greedy")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None (no top-k filter), got {self.top_k}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2 decoder columns, got {self.max_length}")


def delay_pattern(num_codebooks: int, max_length: int, bos: int = BOS_ID, pad: int = EOS_ID) -> torch.Tensor:
    """Forced slots int64 [K, max_length]: BOS for j <= k, PAD for j >= k + max_length - K + 1, else -1."""
    slot = torch.arange(max_length)[None, :]
    k = torch.arange(num_codebooks)[:, None]
    pattern = torch.full((num_codebooks, max_length), FREE, dtype=torch.long)
    pattern = pattern.masked_fill(slot >= k + max_length - num_codebooks + 1, pad)
    return pattern.masked_fill(slot <= k, bos)


@dataclass
class DelayedSampler:
    """Per-step state of upstream's decoding for B samples x K codebooks (no model inside).

    raw: int64 [B, K, n] tokens as drawn (before forcing); pattern: [K, max_length];
    first_unfinished: [B] first codebook without an EOS yet; unfinished: bool [B, K].
    """

    raw: torch.Tensor
    pattern: torch.Tensor
    first_unfinished: torch.Tensor
    unfinished: torch.Tensor
    config: SamplingConfig
    eos: int
    generator: torch.Generator | None

    @classmethod
    def start(
        cls,
        batch: int,
        num_codebooks: int,
        config: SamplingConfig,
        device: torch.device | str = "cpu",
        bos: int = BOS_ID,
        eos: int = EOS_ID,
    ) -> DelayedSampler:
        generator = None
        if config.seed is not None:
            generator = torch.Generator(device=device).manual_seed(config.seed)
        return cls(
            raw=torch.full((batch, num_codebooks, 1), bos, dtype=torch.long, device=device),
            pattern=delay_pattern(num_codebooks, config.max_length, bos, eos).to(device),
            first_unfinished=torch.zeros(batch, dtype=torch.long, device=device),
            unfinished=torch.ones(batch, num_codebooks, dtype=torch.bool, device=device),
            config=config,
            eos=eos,
            generator=generator,
        )

    @property
    def length(self) -> int:
        return self.raw.shape[-1]

    @property
    def done(self) -> bool:
        return self.length >= self.config.max_length or not bool(self.unfinished.any())

    def inputs(self) -> torch.Tensor:
        """Decoder inputs so far, forced slots applied: int64 [B, K, n]."""
        pattern = self.pattern[:, : self.length]
        return torch.where(pattern == FREE, self.raw, pattern.expand_as(self.raw))

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Next-step logits [B, K, V] -> float32 scores with the EOS rules, temperature and top-k applied.

        Advances the EOS-order state (as upstream's processor does on each call): call once per step.
        """
        scores = logits.float().clone()
        num_codebooks = scores.shape[1]
        if self.length - 1 < self._min_new_tokens(num_codebooks):
            scores[..., self.eos] = -math.inf
        # upstream's ParlerTTSLogitsProcessor: move past the first unfinished codebook once it has an EOS
        has_eos = (self.raw == self.eos).any(dim=-1)  # [B, K]
        first_done = has_eos.gather(1, self.first_unfinished[:, None]).squeeze(1)
        self.first_unfinished = self.first_unfinished + (first_done & (self.first_unfinished < num_codebooks - 1))
        banned = torch.arange(num_codebooks, device=scores.device)[None, :] > self.first_unfinished[:, None]
        scores[..., self.eos] = scores[..., self.eos].masked_fill(banned, -math.inf)
        if not self.config.do_sample:
            return scores
        scores = scores / self.config.temperature
        if self.config.top_k is not None and self.config.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.config.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
        return scores

    def _min_new_tokens(self, num_codebooks: int) -> int:
        value = self.config.min_new_tokens
        return num_codebooks + 1 if value is None else value

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """Scores [B, K, V] -> tokens int64 [B, K] (multinomial draw, or argmax when greedy)."""
        if not self.config.do_sample:
            return scores.argmax(dim=-1)
        probs = torch.softmax(scores, dim=-1).reshape(-1, scores.shape[-1])
        return torch.multinomial(probs, 1, generator=self.generator).view(scores.shape[:2])

    def append(self, tokens: torch.Tensor) -> None:
        """Add one column [B, K]; finished rows get PAD (= EOS), rows that just drew EOS finish."""
        tokens = torch.where(self.unfinished, tokens, torch.full_like(tokens, self.eos))
        self.raw = torch.cat([self.raw, tokens[..., None]], dim=-1)
        self.unfinished = self.unfinished & (tokens != self.eos)


@dataclass
class Generated:
    """codes: B tensors int64 [K, T_b] (delay reverted, special ids dropped); delayed: int64 [B, K, N]."""

    codes: list[torch.Tensor]
    delayed: torch.Tensor


@torch.no_grad()
def generate(model: ParlerModule, cond: Conditioning, config: SamplingConfig) -> Generated:
    """Draw codes for a batch conditioned by ``model.encode(...)``; ``model`` must be in eval mode."""
    if model.training:
        raise ValueError("generate() needs the model in eval mode (dropout would corrupt sampling); call model.eval()")
    decoder_config = model.config.decoder
    batch, device = cond.encoder_states.shape[0], cond.encoder_states.device
    positions = (cond.prompt_embeds.shape[1] if cond.prompt_embeds is not None else 0) + config.max_length - 1
    if not decoder_config.rope_embeddings and positions > decoder_config.max_position_embeddings:
        raise ValueError(
            f"transcript + max_length={config.max_length} needs {positions} positions but the model has "
            f"max_position_embeddings={decoder_config.max_position_embeddings}; lower max_length or shorten the text"
        )
    sampler = DelayedSampler.start(
        batch, decoder_config.num_codebooks, config, device, decoder_config.bos_token_id, decoder_config.eos_token_id
    )
    cache = DecoderCache.empty(decoder_config.num_hidden_layers)
    while not sampler.done:
        step = sampler.inputs()[..., -1:].transpose(1, 2)  # last column as [B, 1, K]
        logits = model.decode(step, cond, cache)[:, :, -1]  # [B, K, V]
        sampler.append(sampler.choose(sampler.scores(logits)))
    delayed = sampler.inputs()
    return Generated(undelay_batch(delayed, codebook_size=decoder_config.eos_token_id), delayed)
