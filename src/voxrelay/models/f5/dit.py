"""F5-TTS's DiT (the vector field of its conditional flow matching), written from upstream's description in plain
torch, with upstream's parameter names: a ``CFM.state_dict()`` of f5-tts 1.1.22 (``transformer.*``) loads into
``CFM_KEYS``-prefixed :class:`DiT` as it is, and the outputs equal upstream's on the same inputs
(``tests/unit/models/test_f5_dit.py`` against ``scripts/f5_reference.py``'s recorded outputs).

Shapes: ``x`` (noisy mel) and ``cond`` (the masked clean mel) [B, N, mel_dim]; ``text`` int [B, Nt], -1 padding;
``time`` [B] in [0, 1]; ``mask`` bool [B, N] (None: every frame real).

The pieces, as upstream has them:

- time: sinusoids of 256 (x 1000) -> Linear, SiLU, Linear;
- text: ids + 1 (0 is the filler, so -1 padding -> 0), cut or zero-padded to each sample's frame count, embedded,
  + sinusoidal positions (cos | sin halves), ConvNeXt-V2 blocks with the filler positions zeroed around each;
- input: Linear over [x, cond, text] -> + a grouped convolutional position embedding (2 x Conv1d k31 g16 + Mish,
  padding zeroed);
- blocks: adaLN (shift, scale, gate for attention and MLP from the time embedding), attention with rotary positions
  on every head (GPT-J style interleaved pairs, base 10000), no attention mask, padded rows zeroed after the output
  projection; a tanh-GELU MLP; dropout after the attention's output and inside the MLP;
- out: adaLN (scale, shift) and a Linear to mel_dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DiTSizes:
    """Upstream's ``DiT(...)`` arguments (F5TTS_v1_Base: dim 1024, depth 22, heads 16, ff_mult 2, text_dim 512,
    conv_layers 4; ``text_num_embeds`` the vocabulary's size, 2545 for its pinyin vocab.txt)."""

    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    text_dim: int = 512
    conv_layers: int = 4
    text_num_embeds: int = 2545
    mel_dim: int = 100
    dropout: float = 0.1


def sinusoids(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """[B] -> [B, dim]: sin | cos of ``scale * t`` at ``dim / 2`` log-spaced frequencies."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    angles = scale * t[:, None] * freqs[None]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def text_positions(dim: int, length: int) -> torch.Tensor:
    """[length, dim]: cos | sin of position x ``dim / 2`` frequencies (base 10000)."""
    freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(length), freqs).float()
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class TimeMLP(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, time: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(sinusoids(time, self.freq_dim).to(time.dtype))


class GRN(nn.Module):
    """Global response normalisation (over time, then relative to the channels' mean)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gx = torch.norm(x, p=2, dim=1, keepdim=True)
        return self.gamma * (x * (gx / (gx.mean(dim=-1, keepdim=True) + 1e-6))) + self.beta + x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, inner)
        self.grn = GRN(inner)
        self.pwconv2 = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x.transpose(1, 2)).transpose(1, 2))
        return x + self.pwconv2(self.grn(F.gelu(self.pwconv1(y))))


class TextEmbedding(nn.Module):
    def __init__(self, vocab: int, dim: int, conv_layers: int) -> None:
        super().__init__()
        self.text_embed = nn.Embedding(vocab + 1, dim)  # row 0: the filler
        self.register_buffer("freqs_cis", text_positions(dim, 8192), persistent=False)
        self.text_blocks = nn.Sequential(*[ConvNeXtBlock(dim, 2 * dim) for _ in range(conv_layers)])

    def forward(self, text: torch.Tensor, lengths: torch.Tensor | int, drop_text: bool = False) -> torch.Tensor:
        """[B, Nt] (-1 padding) -> [B, max(lengths), dim]; ``lengths``: each sample's frames (or one count)."""
        ids = text + 1
        width = int(lengths.max()) if torch.is_tensor(lengths) else int(lengths)
        ids = F.pad(ids[:, :width], (0, width - min(ids.shape[1], width)), value=0)
        valid = None
        if torch.is_tensor(lengths):
            valid = torch.arange(width, device=ids.device)[None] < lengths.to(ids.device)[:, None]
            ids = ids.masked_fill(~valid, 0)
        filler = (ids == 0)[..., None]
        out = self.text_embed(torch.zeros_like(ids) if drop_text else ids)
        positions = self.freqs_cis[:width]
        if valid is not None:
            out = out.masked_fill(~valid[..., None], 0.0)
            positions = positions[None] * valid[..., None].to(positions.dtype)
        out = (out + positions).masked_fill(filler, 0.0)
        for block in self.text_blocks:
            out = block(out).masked_fill(filler, 0.0)
        return out


class ConvPositions(nn.Module):
    def __init__(self, dim: int, kernel: int = 31, groups: int = 16) -> None:
        super().__init__()
        conv = [nn.Conv1d(dim, dim, kernel, groups=groups, padding=kernel // 2) for _ in range(2)]
        self.conv1d = nn.Sequential(conv[0], nn.Mish(), conv[1], nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        keep = None if mask is None else mask[:, None]
        y = x.transpose(1, 2)
        for layer in self.conv1d:
            y = y.masked_fill(~keep, 0.0) if keep is not None and isinstance(layer, nn.Conv1d) else y
            y = layer(y)
            y = y.masked_fill(~keep, 0.0) if keep is not None and isinstance(layer, nn.Conv1d) else y
        return y.transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * mel_dim + text_dim, dim)
        self.conv_pos_embed = ConvPositions(dim)

    def forward(self, x, cond, text, drop_audio: bool, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.proj(torch.cat((x, torch.zeros_like(cond) if drop_audio else cond, text), dim=-1))
        return self.conv_pos_embed(h, mask) + h


class Rotary(nn.Module):
    """Rotary positions on interleaved pairs of a head's channels (x-transformers' ``RotaryEmbedding``)."""

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head)))

    def forward(self, n: int) -> torch.Tensor:
        freqs = torch.einsum("i,j->ij", torch.arange(n, device=self.inv_freq.device).type_as(self.inv_freq),
                             self.inv_freq)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)  # [N, dim_head]: each frequency twice, in pairs


def rotate(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    pairs = t.float().unflatten(-1, (-1, 2))
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (t.float() * freqs.cos() + turned * freqs.sin()).to(t.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(dropout)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, freqs: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = (p(x).view(b, -1, self.heads, p.out_features // self.heads).transpose(1, 2)
                   for p in (self.to_q, self.to_k, self.to_v))
        y = F.scaled_dot_product_attention(rotate(q, freqs), rotate(k, freqs), v)
        y = self.to_out[1](self.to_out[0](y.transpose(1, 2).reshape(b, -1, q.shape[1] * q.shape[3])))
        return y if mask is None else y.masked_fill(~mask[..., None], 0.0)


class AdaNorm(nn.Module):
    def __init__(self, dim: int, parts: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, parts * dim)

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.chunk(self.linear(F.silu(t)), self.linear.out_features // self.linear.in_features, dim=1)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.attn_norm = AdaNorm(dim, 6)
        self.attn = Attention(dim, heads, dim_head, dropout)
        self.ff = nn.Module()
        self.ff.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.GELU(approximate="tanh")),
                                   nn.Dropout(dropout), nn.Linear(ff_mult * dim, dim))

    def forward(self, x, t, mask, freqs) -> torch.Tensor:
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.attn_norm(t)
        norm = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale_a[:, None]) + shift_a[:, None]
        x = x + gate_a[:, None] * self.attn(norm, mask, freqs)
        norm = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale_f[:, None]) + shift_f[:, None]
        return x + gate_f[:, None] * self.ff.ff(norm)


class DiT(nn.Module):
    def __init__(self, sizes: DiTSizes) -> None:
        super().__init__()
        s = sizes
        self.sizes = sizes
        self.time_embed = TimeMLP(s.dim)
        self.text_embed = TextEmbedding(s.text_num_embeds, s.text_dim, s.conv_layers)
        self.input_embed = InputEmbedding(s.mel_dim, s.text_dim, s.dim)
        self.rotary_embed = Rotary(s.dim_head)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(s.dim, s.heads, s.dim_head, s.ff_mult, s.dropout) for _ in range(s.depth)])
        self.norm_out = AdaNorm(s.dim, 2)
        self.proj_out = nn.Linear(s.dim, s.mel_dim)
        # upstream's init: the modulations and the output start at zero (a fresh model's field is 0)
        for layer in [*(b.attn_norm.linear for b in self.transformer_blocks), self.norm_out.linear, self.proj_out]:
            if layer.weight.device.type != "meta":
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)

    def embed(self, x, cond, text, mask, drop_audio: bool, drop_text: bool) -> torch.Tensor:
        lengths = mask.sum(dim=1) if mask is not None else x.shape[1]
        return self.input_embed(x, cond, self.text_embed(text, lengths, drop_text), drop_audio, mask)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, text: torch.Tensor, time: torch.Tensor,
                mask: torch.Tensor | None = None, drop_audio_cond: bool = False, drop_text: bool = False,
                cfg_infer: bool = False) -> torch.Tensor:
        """The vector field [B, N, mel_dim] (``cfg_infer``: [2B, ...], conditioned then unconditioned)."""
        time = time.repeat(x.shape[0]) if time.ndim == 0 else time
        t = self.time_embed(time)
        if cfg_infer:
            h = torch.cat((self.embed(x, cond, text, mask, False, False), self.embed(x, cond, text, mask, True, True)))
            t, mask = torch.cat((t, t)), (torch.cat((mask, mask)) if mask is not None else None)
        else:
            h = self.embed(x, cond, text, mask, drop_audio_cond, drop_text)
        freqs = self.rotary_embed(x.shape[1])
        for block in self.transformer_blocks:
            h = block(h, t, mask, freqs)
        scale, shift = self.norm_out(t)
        h = F.layer_norm(h, h.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out(h)
