"""Building an ``f5`` model: random with the config's sizes, or from an f5-tts checkpoint (its released EMA file,
a ``model_*.safetensors`` of its trainer, or a voxrelay export), the sizes read from the weights' shapes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from voxrelay.errors import one_line
from voxrelay.models.f5.dit import DiT, DiTSizes
from voxrelay.models.f5.model import EMA_PREFIX, F5, SETTINGS, F5Trainer
from voxrelay.models.f5.text import Vocab
from voxrelay.models.hf import ModelLoadError, ModelNotFoundError, read_meta

MODEL = "transformer."
DROPPED = ("initted", "step")  # ema_pytorch's counters in released files


def checkpoint_file(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise ModelNotFoundError(f"model.init_from={spec!r}: no such file; point it at an f5-tts checkpoint "
                                 ".safetensors (e.g. F5TTS_v1_Base/model_1250000.safetensors) or a voxrelay export")
    if path.suffix != ".safetensors":
        raise ModelLoadError(f"model.init_from={spec!r} is not a .safetensors file; voxrelay reads no pickles (.pt): "
                             "use the released .safetensors, or convert the .pt's ema_model_state_dict yourself")
    return path


def read_weights(spec: str) -> dict[str, torch.Tensor]:
    """The DiT's weights of a checkpoint, keyed as in :class:`DiT` (EMA weights when the file has them)."""
    from safetensors.torch import load_file

    state = load_file(str(checkpoint_file(spec)))
    prefix = EMA_PREFIX + MODEL if any(k.startswith(EMA_PREFIX) for k in state) else MODEL
    weights = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not weights:
        raise ModelLoadError(f"model.init_from={spec!r} holds no {prefix}* tensors: not an f5-tts checkpoint")
    return weights


def sizes_of(weights: dict[str, torch.Tensor], dropout: float) -> DiTSizes:
    """The architecture a checkpoint's tensors imply (F5's DiT keeps 64 channels per head)."""
    try:
        dim = weights["proj_out.weight"].shape[1]
        text_rows, text_dim = weights["text_embed.text_embed.weight"].shape
        depth = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("transformer_blocks."))
        convs = [int(k.split(".")[2]) for k in weights if k.startswith("text_embed.text_blocks.")]
        ff = weights["transformer_blocks.0.ff.ff.0.0.weight"].shape[0] // dim
        head = weights["rotary_embed.inv_freq"].shape[0] * 2
        inner = weights["transformer_blocks.0.attn.to_q.weight"].shape[0]
    except (KeyError, ValueError, IndexError) as e:
        raise ModelLoadError(f"the checkpoint lacks F5 DiT tensors ({one_line(e)}): not an F5-TTS v1 model") from None
    return DiTSizes(dim=dim, depth=depth, heads=inner // head, dim_head=head, ff_mult=ff, text_dim=text_dim,
                    conv_layers=1 + max(convs) if convs else 0, text_num_embeds=text_rows - 1,
                    mel_dim=weights["proj_out.weight"].shape[0], dropout=dropout)


def build(cfg: Any, data: Any, seed: int, meta: bool = False) -> F5:
    vocab = Vocab.read(cfg.vocab) if cfg.vocab else Vocab.utf8()
    if cfg.vocoder and not meta:  # a vocoder that cannot load fails now, not at the first evaluation hours in
        from voxrelay.models.f5.synthesis import vocoder

        vocoder(cfg.vocoder)  # loaded once: synthesis in this process takes it from the cache
    new_rows = (0, 0)
    if cfg.init_from:
        weights = read_weights(cfg.init_from)
        sizes = sizes_of(weights, cfg.dropout)
        if sizes.text_num_embeds > len(vocab):
            raise ModelLoadError(f"model.init_from={cfg.init_from!r} has {sizes.text_num_embeds} text tokens but the "
                                 f"vocabulary {cfg.vocab or 'UTF-8 bytes'!r} has {len(vocab)}: set model.vocab to the "
                                 "checkpoint's vocab.txt (with new tokens as lines after its own)")
        if sizes.text_num_embeds < len(vocab):  # a new language's tokens, as lines after the checkpoint's
            new_rows = (sizes.text_num_embeds + 1, len(vocab) + 1)  # row 0 is the filler
            weights = grown(weights, len(vocab) + 1, seed)
            sizes = dataclasses.replace(sizes, text_num_embeds=len(vocab))
    else:
        weights, sizes = None, DiTSizes(dim=cfg.dim, depth=cfg.depth, heads=cfg.heads, dim_head=64,
                                        ff_mult=cfg.ff_mult, text_dim=cfg.text_dim, conv_layers=cfg.conv_layers,
                                        text_num_embeds=len(vocab), dropout=cfg.dropout)
    settings = {key: getattr(cfg, key) for key in SETTINGS}
    model = assemble(sizes, weights, vocab, settings, cfg.ema, seed, meta)
    model.new_rows = new_rows
    return model


def grown(weights: dict[str, torch.Tensor], rows: int, seed: int) -> dict[str, torch.Tensor]:
    """``weights`` with the text embedding grown to ``rows``: the new rows drawn from N(0, 1) by ``seed`` (as
    upstream's finetune tool extends a vocabulary)."""
    old = weights["text_embed.text_embed.weight"]
    extra = torch.randn((rows - old.shape[0], old.shape[1]), generator=torch.Generator().manual_seed(seed))
    return weights | {"text_embed.text_embed.weight": torch.cat([old, extra.to(old.dtype)])}


def assemble(sizes: DiTSizes, weights: dict | None, vocab: Vocab, settings: dict, ema: bool, seed: int,
             meta: bool = False) -> F5:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("meta" if meta else "cpu"):
            dit = DiT(sizes)
    if weights is not None and not meta:
        try:
            dit.load_state_dict(weights)
        except RuntimeError as e:
            raise ModelLoadError(f"the checkpoint's tensors do not fit an F5 DiT ({one_line(e)[:300]})") from None
    return F5(F5Trainer(dit, torch.Generator().manual_seed(seed)), vocab, settings, ema)


def load(folder: str | os.PathLike[str]) -> F5:
    """A folder written by ``F5.save_pretrained`` (no network access)."""
    folder = Path(folder)
    meta = read_meta(folder, "f5", 1)
    vocab = Vocab.read(folder / "vocab.txt") if (folder / "vocab.txt").is_file() else Vocab.utf8()
    sizes = DiTSizes(**meta["sizes"])
    model = assemble(sizes, read_weights(str(folder)), vocab, dict(meta["settings"]), False, 0)
    model.load_voices(folder)
    return model
