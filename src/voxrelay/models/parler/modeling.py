"""Parler-TTS' model core (upstream parler-tts 0.2.3), weight-compatible, without the audio codec.

``ParlerModule.state_dict()`` has upstream's names minus ``audio_encoder.*``:

- ``text_encoder.*``: T5 encoder over the description (transformers ``T5EncoderModel``);
- ``enc_to_dec_proj``: T5 width -> decoder width, only when they differ;
- ``embed_prompts``: embedding of the transcript ("prompt") ids, prepended to the decoder inputs;
- ``decoder.model.decoder.*``: K summed codebook embeddings, sinusoids ``embed_positions.weights`` (a
  buffer, recomputable) or RoPE, pre-LN layers (self-attn, cross-attn on the description, GELU MLP),
  final ``layer_norm``; ``decoder.lm_heads.{k}`` (a fused checkpoint is split by :mod:`.keymap`).

Upstream behaviour kept: positions run over prompt + audio, prompt padding included; self-attention
masks prompt padding with an additive float mask (a fully masked row attends uniformly, as upstream on
CPU, instead of giving NaN); description states are zeroed where their mask is 0; with RoPE the
cross-attention queries are rotated too. Prompt positions get no logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from transformers import T5EncoderModel
from transformers.activations import ACT2FN

from voxrelay.models.parler.shapes import ParlerConfig, ParlerDecoderConfig  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from voxrelay.models.parler.generation import DecoderCache, LayerCache


Rope = tuple[torch.Tensor, torch.Tensor]


def sinusoid_table(num_positions: int, dim: int) -> torch.Tensor:
    """Upstream's (tensor2tensor) sinusoids float32 [P, D]: cosines in the first half, sines in the second."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angles = torch.arange(num_positions, dtype=torch.int64).float()[:, None] * freqs[None, :]
    table = torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_positions, 1)], dim=1)
    return table


class SinusoidalPositions(nn.Module):
    """The sinusoid table as a persistent buffer ``weights`` [P, D] (upstream stores it)."""

    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weights", weights)

    @classmethod
    def create(cls, num_positions: int, dim: int) -> SinusoidalPositions:
        return cls(sinusoid_table(num_positions, dim))

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Rows ``start .. start+length-1``: [length, D]."""
        if start + length > self.weights.shape[0]:
            raise ValueError(
                f"sequence of {start + length} positions (prompt + audio) exceeds max_position_embeddings="
                f"{self.weights.shape[0]}; shorten the transcript/audio or raise max_position_embeddings"
            )
        return self.weights[start : start + length]


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> Rope:
    """RoPE (cos, sin) [L, head_dim] for int positions [L], computed in float32 then cast (upstream's
    ``ParlerTTSRotaryEmbedding``, whose buffers are not in the state dict)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate x [B, H, L, Dh] by (cos, sin) [L, Dh] (half-split convention)."""
    cos, sin = rope
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class ParlerAttention(nn.Module):
    """Bias-free multi-head attention with grouped KV heads (upstream ``ParlerTTSAttention`` names)."""

    def __init__(self, projections: tuple[nn.Linear, ...], num_heads: int, dropout: float) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = projections
        self.num_heads = num_heads
        self.dropout = dropout

    @classmethod
    def create(cls, hidden: int, num_heads: int, num_kv_heads: int, dropout: float) -> ParlerAttention:
        kv_width = num_kv_heads * (hidden // num_heads)
        widths = (hidden, kv_width, kv_width, hidden)
        return cls(tuple(nn.Linear(hidden, width, bias=False) for width in widths), num_heads, dropout)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H*Dh] -> [B, H, L, Dh] with Dh = hidden / num_heads."""
        batch, length, width = x.shape
        head_dim = self.q_proj.out_features // self.num_heads
        return x.view(batch, length, width // head_dim, head_dim).transpose(1, 2)

    def keys_values(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """states [B, S, D] -> keys, values [B, H_kv, S, Dh]."""
        return self._heads(self.k_proj(states)), self._heads(self.v_proj(states))

    def forward(
        self,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        rope: Rope | None,
    ) -> torch.Tensor:
        """x [B, L, D] attends over keys/values [B, H_kv, S, Dh]; mask additive [B, 1, L, S] -> [B, L, D]."""
        query = self._heads(self.q_proj(x))
        if rope is not None:
            query = apply_rope(query, rope)
        groups = self.num_heads // keys.shape[1]
        if groups > 1:  # kv head h serves query heads h*groups .. h*groups+groups-1 (upstream's repeat_kv)
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )
        batch, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))


@dataclass
class LayerInputs:
    """What every layer of one decoder call shares (masks additive float, or None)."""

    self_mask: torch.Tensor | None
    causal: bool
    rope: Rope | None
    encoder_states: torch.Tensor
    encoder_mask: torch.Tensor | None


class ParlerDecoderLayer(nn.Module):
    """Pre-LN: x += self-attn(LN x); x += cross-attn(LN x, description); x += fc2(act(fc1(LN x)))."""

    def __init__(
        self,
        attentions: tuple[ParlerAttention, ParlerAttention],
        mlp: tuple[nn.Linear, nn.Linear],
        norms: tuple[nn.LayerNorm, nn.LayerNorm, nn.LayerNorm],
        activation: str,
        dropouts: tuple[float, float],
    ) -> None:
        super().__init__()
        (self.self_attn, self.encoder_attn), (self.fc1, self.fc2) = attentions, mlp
        self.self_attn_layer_norm, self.encoder_attn_layer_norm, self.final_layer_norm = norms
        self.activation = activation
        self.dropout, self.activation_dropout = dropouts

    @classmethod
    def create(cls, cfg: ParlerDecoderConfig) -> ParlerDecoderLayer:
        d, heads = cfg.hidden_size, cfg.num_attention_heads
        return cls(
            (
                ParlerAttention.create(d, heads, cfg.num_key_value_heads, cfg.attention_dropout),
                ParlerAttention.create(d, heads, cfg.num_cross_attention_key_value_heads, cfg.attention_dropout),
            ),
            (nn.Linear(d, cfg.ffn_dim, bias=False), nn.Linear(cfg.ffn_dim, d, bias=False)),
            (nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)),
            cfg.activation_function,
            (cfg.dropout, cfg.activation_dropout),
        )

    def _self_kv(self, h: torch.Tensor, rope: Rope | None, cache: LayerCache | None) -> tuple[torch.Tensor, ...]:
        keys, values = self.self_attn.keys_values(h)
        if rope is not None:  # cached keys keep their rotation: only new keys are rotated
            keys = apply_rope(keys, rope)
        if cache is not None:
            if cache.keys is not None:
                keys, values = torch.cat([cache.keys, keys], dim=2), torch.cat([cache.values, values], dim=2)
            cache.keys, cache.values = keys, values
        return keys, values

    def _cross_kv(self, states: torch.Tensor, cache: LayerCache | None) -> tuple[torch.Tensor, ...]:
        if cache is not None and cache.cross_keys is not None:
            return cache.cross_keys, cache.cross_values
        keys, values = self.encoder_attn.keys_values(states)
        if cache is not None:
            cache.cross_keys, cache.cross_values = keys, values
        return keys, values

    def forward(self, x: torch.Tensor, inputs: LayerInputs, cache: LayerCache | None) -> torch.Tensor:
        """x [B, L, D] -> [B, L, D]."""
        h = self.self_attn_layer_norm(x)
        keys, values = self._self_kv(h, inputs.rope, cache)
        h = self.self_attn(h, keys, values, inputs.self_mask, inputs.causal, inputs.rope)
        x = x + F.dropout(h, self.dropout, self.training)
        h = self.encoder_attn_layer_norm(x)
        keys, values = self._cross_kv(inputs.encoder_states, cache)
        h = self.encoder_attn(h, keys, values, inputs.encoder_mask, False, inputs.rope)
        x = x + F.dropout(h, self.dropout, self.training)
        h = ACT2FN[self.activation](self.fc1(self.final_layer_norm(x)))
        h = self.fc2(F.dropout(h, self.activation_dropout, self.training))
        return x + F.dropout(h, self.dropout, self.training)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = attend) -> additive float mask: 0 or the dtype's minimum (upstream's, not -inf)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def self_attention_mask(
    key_mask: torch.Tensor | None, past: int, length: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, bool]:
    """(additive mask [B|1, 1, L, S] or None, use SDPA's is_causal) for L new queries after ``past`` keys."""
    if key_mask is None and past == 0:
        return None, length > 1
    if key_mask is None and length == 1:
        return None, False  # one new query may see every cached key
    key_pos = torch.arange(past + length, device=device)
    allowed = (key_pos[None, :] <= (past + torch.arange(length, device=device))[:, None])[None]  # [1, L, S]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, :].bool()  # [B, L, S]
    return additive_mask(allowed, dtype)[:, None], False


class ParlerDecoder(nn.Module):
    """Upstream ``ParlerTTSDecoder`` (state-dict prefix ``decoder.model.decoder``)."""

    def __init__(
        self,
        embed_tokens: nn.ModuleList,
        embed_positions: SinusoidalPositions | None,
        layers: nn.ModuleList,
        layer_norm: nn.LayerNorm,
        dropout: float,
        rope: tuple[int, float] | None,
    ) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions = embed_tokens, embed_positions
        self.layers, self.layer_norm, self.dropout = layers, layer_norm, dropout
        self.rope = rope  # (head_dim, theta) with RoPE, None with sinusoids

    @classmethod
    def create(cls, cfg: ParlerDecoderConfig) -> ParlerDecoder:
        d = cfg.hidden_size
        # vocab + 1 rows per codebook: upstream's historical "+1 for pad", kept for weight compatibility
        embeds = nn.ModuleList([nn.Embedding(cfg.vocab_size + 1, d) for _ in range(cfg.num_codebooks)])
        sinusoids = None if cfg.rope_embeddings else SinusoidalPositions.create(cfg.max_position_embeddings, d)
        rope = (d // cfg.num_attention_heads, cfg.rope_theta) if cfg.rope_embeddings else None
        layers = nn.ModuleList([ParlerDecoderLayer.create(cfg) for _ in range(cfg.num_hidden_layers)])
        return cls(embeds, sinusoids, layers, nn.LayerNorm(d), cfg.dropout, rope)

    def forward(
        self,
        input_ids: torch.Tensor,
        prompt_embeds: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        encoder_states: torch.Tensor,
        encoder_mask: torch.Tensor | None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T, K] (delayed codes), prompt_embeds [B, Lp, D] prepended -> hidden [B, Lp+T, D].

        key_mask [B, past+Lp+T] (1 = real token) covers every key, cached ones included.
        """
        x = sum(embed(input_ids[..., k]) for k, embed in enumerate(self.embed_tokens))
        if prompt_embeds is not None:
            x = torch.cat([prompt_embeds.to(x.dtype), x], dim=1)
        past, length = (cache.length if cache is not None else 0), x.shape[1]
        rope = None
        if self.embed_positions is not None:
            x = x + self.embed_positions(past, length).to(x.dtype)
        else:
            rope = rope_tables(torch.arange(past, past + length, device=x.device), *self.rope, x.dtype)
        x = F.dropout(x, self.dropout, self.training)
        self_mask, causal = self_attention_mask(key_mask, past, length, x.dtype, x.device)
        cross_mask = None if encoder_mask is None else additive_mask(encoder_mask[:, None, None, :].bool(), x.dtype)
        inputs = LayerInputs(self_mask, causal, rope, encoder_states.to(x.dtype), cross_mask)
        for i, layer in enumerate(self.layers):
            x = layer(x, inputs, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length = past + length
        return self.layer_norm(x)


class ParlerCausalLM(nn.Module):
    """Upstream's ``ParlerTTSForCausalLM``: ``model.decoder`` + one head per codebook ``lm_heads.{k}``."""

    def __init__(self, model: nn.ModuleDict, lm_heads: nn.ModuleList) -> None:
        super().__init__()
        self.model, self.lm_heads = model, lm_heads  # model: {"decoder": ParlerDecoder}, upstream's ParlerTTSModel

    @classmethod
    def create(cls, cfg: ParlerDecoderConfig) -> ParlerCausalLM:
        heads = [nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_codebooks)]
        return cls(nn.ModuleDict({"decoder": ParlerDecoder.create(cfg)}), nn.ModuleList(heads))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, D] -> logits [B, K, T, V]."""
        return torch.stack([head(hidden) for head in self.lm_heads], dim=1)


@dataclass
class Conditioning:
    """Decoder conditioning for one batch (from :meth:`ParlerModule.encode`).

    encoder_states [B, S, D] (projected, zeroed at padding), encoder_mask [B, S] or None (no padding),
    prompt_embeds [B, Lp, D] or None (no transcript), prompt_mask [B, Lp] or None (no padding).
    """

    encoder_states: torch.Tensor
    encoder_mask: torch.Tensor | None
    prompt_embeds: torch.Tensor | None
    prompt_mask: torch.Tensor | None


def _padding_only(mask: torch.Tensor | None) -> torch.Tensor | None:
    """None when a mask has no padding: lets SDPA take its causal/unmasked fast paths."""
    return None if mask is None or bool(mask.all()) else mask


class ParlerModule(nn.Module):
    """Parler-TTS without its codec: description (T5) + transcript -> logits over delayed DAC codes."""

    def __init__(
        self,
        config: ParlerConfig,
        text_encoder: T5EncoderModel,
        enc_to_dec_proj: nn.Linear | None,
        embed_prompts: nn.Embedding,
        decoder: ParlerCausalLM,
    ) -> None:
        super().__init__()
        self.config, self.text_encoder, self.enc_to_dec_proj = config, text_encoder, enc_to_dec_proj
        self.embed_prompts, self.decoder = embed_prompts, decoder

    @classmethod
    def from_config(cls, config: ParlerConfig) -> ParlerModule:
        """Build on the current default device; weights as the constructors leave them (see :func:`build_parler`)."""
        d = config.decoder.hidden_size
        proj = nn.Linear(int(config.text_encoder["d_model"]), d) if config.projects_encoder else None
        prompts = nn.Embedding(config.prompt_vocab_size, d)
        return cls(config, T5EncoderModel(config.t5_config()), proj, prompts, ParlerCausalLM.create(config.decoder))

    def reset_positions(self) -> None:
        """Recompute every sinusoid table (they are not learned; e.g. after ``to_empty`` from meta)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, SinusoidalPositions):
                    module.weights.copy_(sinusoid_table(*module.weights.shape).to(module.weights.dtype))

    def encode(
        self,
        description_ids: torch.Tensor | None,
        description_mask: torch.Tensor | None = None,
        prompt_ids: torch.Tensor | None = None,
        prompt_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
    ) -> Conditioning:
        """Description ids/mask [B, S] (or T5's raw ``encoder_hidden_states`` [B, S, D_t5], e.g. cached from
        a frozen T5) and transcript ids/mask [B, Lp] (left-padded, as upstream trains) -> :class:`Conditioning`."""
        states = encoder_hidden_states
        if states is None:
            states = self.text_encoder(input_ids=description_ids, attention_mask=description_mask).last_hidden_state
        if self.enc_to_dec_proj is not None:
            states = self.enc_to_dec_proj(states)
        if description_mask is not None:
            states = states * description_mask[..., None].to(states.dtype)
        prompt = self.embed_prompts(prompt_ids) if prompt_ids is not None else None
        return Conditioning(states, _padding_only(description_mask), prompt, _padding_only(prompt_mask))

    def decode(self, input_ids: torch.Tensor, cond: Conditioning, cache: DecoderCache | None = None) -> torch.Tensor:
        """Delayed decoder inputs [B, T, K] -> logits [B, K, T, V] (audio positions only).

        With an empty (or no) cache the transcript is prepended; later cached calls pass new steps only.
        """
        past = cache.length if cache is not None else 0
        prompt = cond.prompt_embeds if past == 0 else None
        key_mask = None
        if cond.prompt_mask is not None:  # every key: prompt (maybe padded), then audio steps (never padded)
            total = past + (prompt.shape[1] if prompt is not None else 0) + input_ids.shape[1]
            ones = cond.prompt_mask.new_ones((input_ids.shape[0], total - cond.prompt_mask.shape[1]))
            key_mask = torch.cat([cond.prompt_mask, ones], dim=1)
        decoder = self.decoder.model["decoder"]
        hidden = decoder(input_ids, prompt, key_mask, cond.encoder_states, cond.encoder_mask, cache)
        return self.decoder.logits(hidden[:, hidden.shape[1] - input_ids.shape[1] :])

    def forward(
        self,
        input_ids: torch.Tensor,
        description_ids: torch.Tensor | None = None,
        description_mask: torch.Tensor | None = None,
        prompt_ids: torch.Tensor | None = None,
        prompt_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: input_ids [B, T, K] (:func:`.delay.decoder_inputs`) -> logits [B, K, T, V]."""
        cond = self.encode(description_ids, description_mask, prompt_ids, prompt_mask, encoder_hidden_states)
        return self.decode(input_ids, cond)


def build_parler(config: ParlerConfig, device: str | torch.device = "cpu", seed: int = 0) -> ParlerModule:
    """A ParlerModule on ``device``: "meta" gives shapes only (memory planning, no allocation); any other
    device gets a seeded random init (T5 as transformers inits it; decoder Linear/Embedding weights
    ~ N(0, initializer_factor) as upstream; sinusoids exact). The global RNG is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            module = ParlerModule.from_config(config)
        if torch.device(device).type != "meta":
            std = config.decoder.initializer_factor
            with torch.no_grad():
                for sub in module.decoder.modules():
                    if isinstance(sub, (nn.Linear, nn.Embedding)):
                        sub.weight.normal_(0.0, std)
    return module
