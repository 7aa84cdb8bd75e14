"""F5-TTS synthesis as upstream's ``infer_process`` does it: the prompt's transcript then the new text, the prompt's
mel (its level raised to an RMS of 0.1 when quieter, the output scaled back), a duration estimated from the prompt's
frames per byte of text, the ODE fill, the prompt's frames cut off, Vocos."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from voxrelay.codecs.pcm import samples
from voxrelay.models.base import RequestError, Speech
from voxrelay.models.f5 import flow
from voxrelay.models.f5.config import SAMPLE_RATE
from voxrelay.models.f5.text import batch_ids

TARGET_RMS = 0.1


@functools.lru_cache(maxsize=2)
def vocoder(folder: str) -> Any:
    from voxrelay.models.f5.vocos import Vocos

    return Vocos.load(folder)


def duration(prompt_frames: int, prompt_text: str, text: str) -> int:
    """Upstream's estimate: the prompt's frames + its frames per UTF-8 byte x the new text's bytes (a text under 10
    bytes spoken at 0.3 of the speed)."""
    speed = 0.3 if len(text.encode("utf-8")) < 10 else 1.0
    per_byte = prompt_frames / max(1, len(prompt_text.encode("utf-8")))
    return prompt_frames + int(per_byte * len(text.encode("utf-8")) / speed)


def speak(model: Any, prompt_row: Any, text: str, max_frames: int | None, seed: int) -> Speech:
    settings = model.settings
    if not settings.get("vocoder"):
        raise RequestError("model.family=f5 speaks through a Vocos vocoder: set model.vocoder to its folder (e.g. "
                           "a download of charactr/vocos-mel-24khz: config.yaml + pytorch_model.bin)")
    wav = torch.from_numpy(samples(prompt_row.codes))[None]
    rms = float(wav.square().mean().sqrt())
    gain = TARGET_RMS / rms if 0 < rms < TARGET_RMS else 1.0
    prompt_text = prompt_row.text + (" " if len(prompt_row.text[-1:].encode("utf-8")) == 1 else "")
    device = next(model.module.parameters()).device
    mel = flow.log_mel(wav * gain).transpose(1, 2).to(device)  # [1, P, 100]
    p = mel.shape[1]
    total = duration(p, prompt_text, text)
    if max_frames is not None:
        total = min(total, p + max(1, max_frames))
    ids = batch_ids([model.vocab.encode(prompt_text + text)]).to(device)
    was_training = model.module.training
    model.module.eval()
    try:
        out, _ = flow.sample(model.dit, mel, ids, total, steps=int(settings["steps"]),
                             cfg=float(settings["cfg_strength"]), sway=settings["sway"], seed=seed)
    finally:
        model.module.train(was_training)
    generated = out[:, p:]  # [1, n, 100]
    audio = vocoder(str(settings["vocoder"])).decode(generated.transpose(1, 2).float().cpu())[0]
    audio = audio / gain if gain != 1.0 else audio
    return Speech(audio.numpy().astype(np.float32), SAMPLE_RATE, int(generated.shape[1]))
