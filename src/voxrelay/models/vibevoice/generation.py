"""Synthesis with transformers' VibeVoice generation (greedy tokens; per audio token a latent denoised by
DPM-Solver++ with classifier-free guidance, decoded, fed back with its semantic features), using our own
sampler (:mod:`.schedule`) so that diffusers is not needed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from voxrelay.models.base import RequestError, Speech
from voxrelay.models.vibevoice.config import SAMPLE_RATE
from voxrelay.models.vibevoice.examples import normalize, samples
from voxrelay.models.vibevoice.schedule import CosineVSchedule
from voxrelay.models.vibevoice.script import ScriptError, parse_script

if TYPE_CHECKING:
    from voxrelay.models.base import Request
    from voxrelay.models.vibevoice.model import VibeVoice


def voice_prompts(model: VibeVoice, request: Request, labels: list[str]) -> dict[int, np.ndarray]:
    """Speaker -> its prompt clip (normalised samples): the request's clips, else clips of the training data's
    voices that ``request.speaker`` names."""
    clips = list(request.voice_prompts)
    if clips and len(clips) != len(labels):
        named = ", ".join(f"Speaker {i}" for i in range(len(labels)))
        raise RequestError(f"the script has {len(labels)} speaker(s) ({named}) but {len(clips)} voice prompt(s) were "
                           "given: give one per speaker (--voice 0=a.wav --voice 1=b.wav), or none")
    if clips:
        return {i: normalize(c) for i, c in enumerate(clips)}
    return {i: prompt_audio(model, r) for i, r in model.maker.prompts_for(request.speaker, len(labels)).items()}


def prompt_audio(model: VibeVoice, row) -> np.ndarray:
    """A training row's clip as a voice prompt: its audio, or, where the data stores the encoders' outputs, the
    σ-VAE's decoding of its stored means (normalised as the feature extractor would)."""
    if not model.maker.features:
        return samples(row)
    inner = model.net.model
    width = int(inner.config.audio_config.hidden_size)
    tower = inner.audio_tower
    param = next(tower.parameters())
    means = torch.from_numpy(np.asarray(row.codes, dtype=np.float32)[:width].T.copy())[None]
    with torch.no_grad():
        audio = tower.decode(means.to(param.device, param.dtype)).audio
    return normalize(audio.float().cpu().numpy().reshape(-1))


def _audio_inputs(prompts: dict[int, np.ndarray], hop: int, device: torch.device) -> dict[str, torch.Tensor]:
    if not prompts:
        return {}
    clips = [prompts[i] for i in sorted(prompts)]
    longest = -(-max(len(c) for c in clips) // hop) * hop  # whole latents, as the feature extractor pads
    values = torch.zeros((len(clips), 1, longest))
    mask = torch.zeros((len(clips), longest), dtype=torch.bool)
    for j, c in enumerate(clips):
        values[j, 0, : len(c)] = torch.from_numpy(c)
        mask[j, : len(c)] = True
    return {"input_values": values.to(device), "padding_mask": mask.to(device)}


def speak(model: VibeVoice, request: Request, max_frames: int | None, seed: int) -> Speech:
    """See :meth:`VibeVoice.speak`."""
    try:
        turns, labels = parse_script(request.text)
    except ScriptError as e:
        raise RequestError(f"the script cannot be read: {e}") from None
    prompts = voice_prompts(model, request, labels)
    ids = model.maker.prompt_ids(turns, {i: -(-len(c) // model.maker.hop) for i, c in prompts.items()})
    room = model.max_length - len(ids) - 2
    if room < 1:
        raise RequestError(f"the script and voice prompts take {len(ids)} tokens, which leaves no room for speech "
                           f"under model.max_length={model.max_length}: shorten them")
    limit = room if max_frames is None else max(1, min(max_frames, room))
    net = model.net
    device = next(net.parameters()).device
    eos = model.maker.ids["eos"]
    kwargs = {"input_ids": torch.tensor([ids], device=device),
              "attention_mask": torch.ones((1, len(ids)), dtype=torch.int64, device=device),
              **_audio_inputs(prompts, model.maker.hop, device), "sample": False, "noise_scheduler": CosineVSchedule(),
              "num_diffusion_steps": model.settings["diffusion_steps"],
              "guidance_scale": model.settings["guidance_scale"], "max_new_tokens": limit, "eos_token_id": eos,
              "pad_token_id": eos, "return_dict_in_generate": True}
    devices = [device] if device.type == "cuda" else []
    was_training = net.training
    net.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            out = model.module.generate_speech(**kwargs)
    finally:
        net.train(was_training)
    frames = int((out.sequences[0, len(ids):] == model.maker.ids["pad"]).sum())
    audio = out.audio[0]
    wav = np.zeros(0, dtype=np.float32) if audio is None else audio.float().cpu().numpy().reshape(-1)
    return Speech(wav.astype(np.float32), SAMPLE_RATE, frames)
