"""Synthesis with transformers' VibeVoice generation (greedy tokens; per audio token a latent denoised by
DPM-Solver++ with classifier-free guidance, decoded, fed back with its semantic features), using our own
sampler (:mod:`.schedule`) so that diffusers is not needed."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from voxrelay.models.base import RequestError, Speech
from voxrelay.models.vibevoice.config import SAMPLE_RATE
from voxrelay.models.vibevoice.latent_codec import normalize
from voxrelay.models.vibevoice.schedule import CosineVSchedule
from voxrelay.models.vibevoice.script import ScriptError, parse_script

if TYPE_CHECKING:
    from voxrelay.models.base import Request
    from voxrelay.models.vibevoice.model import VibeVoice


def voice_prompts(model: VibeVoice, request: Request, labels: list[str]) -> dict[int, np.ndarray]:
    """Speaker -> its prompt clip as training takes it (:meth:`ExampleMaker.clip`): normalised samples [N], or the
    encoders' stored outputs [T, Da + Ds] (``codec.type: vibevoice_latents``; a request carries them as stored,
    [Da + Ds, T]): the request's clips, else clips of the training data's voices that ``request.speaker`` names."""
    clips = list(request.voice_prompts)
    if clips and len(clips) != len(labels):
        named = ", ".join(f"Speaker {i}" for i in range(len(labels)))
        raise RequestError(f"the script has {len(labels)} speaker(s) ({named}) but {len(clips)} voice prompt(s) were "
                           "given: give one per speaker (--voice 0=a.wav --voice 1=b.wav), or none")
    if clips:
        return {i: np.array(c, dtype=np.float32).T if np.ndim(c) == 2 else normalize(c) for i, c in enumerate(clips)}
    return {i: model.maker.clip(r.codes) for i, r in model.maker.prompts_for(request.speaker, len(labels)).items()}


def waveform(model: VibeVoice, clip: np.ndarray) -> np.ndarray:
    """A prompt clip as audio: stored latents decoded by the σ-VAE's decoder (through the root module, so under
    FSDP its parameters are gathered), normalised as the feature extractor would."""
    if clip.ndim == 1:
        return clip
    width = int(model.net.model.config.audio_config.hidden_size)
    means = torch.from_numpy(np.ascontiguousarray(clip[:, :width]))[None]
    with torch.no_grad():
        audio = model.module.decode_means(means)
    return normalize(audio.float().cpu().numpy().reshape(-1))


@contextmanager
def stored_features(net, clips: list[np.ndarray]):
    """While generating: the prompts' acoustic features from their stored means, scaled and projected as the
    model's own ``get_audio_features`` does from audio (without noise, as synthesis asks), so a prompt conditions
    synthesis exactly as it conditioned training; no σ-VAE round trip."""
    inner = net.model
    width = int(inner.config.audio_config.hidden_size)

    def features(input_values, padding_mask, sample=True, **kwargs):
        param = inner.latent_scaling_factor
        means = torch.zeros((len(clips), max(len(c) for c in clips), width), dtype=param.dtype, device=param.device)
        for j, c in enumerate(clips):
            means[j, : len(c)] = torch.from_numpy(np.ascontiguousarray(c[:, :width])).to(means)
        scaled = (means + inner.latent_bias_factor) * inner.latent_scaling_factor
        counts = torch.tensor([len(c) for c in clips], device=means.device)
        mask = torch.arange(means.shape[1], device=means.device)[None, :] < counts[:, None]
        return BaseModelOutputWithPooling(last_hidden_state=scaled[mask],
                                          pooler_output=inner.multi_modal_projector(scaled)[mask])

    inner.get_audio_features = features
    try:
        yield
    finally:
        del inner.get_audio_features  # the class's own again


def _audio_inputs(prompts: dict[int, np.ndarray], hop: int, device: torch.device,
                  dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """``input_values``/``padding_mask`` of the prompts (zeros of the right length for stored latents: their
    features come from :func:`stored_features`), in ``dtype``: the encoders' (a base held in bf16 takes bf16
    audio; outside autocast, float32 audio into bf16 convolutions is an error)."""
    if not prompts:
        return {}
    clips = [prompts[i] for i in sorted(prompts)]
    sizes = [len(c) * hop if c.ndim == 2 else len(c) for c in clips]
    longest = -(-max(sizes) // hop) * hop  # whole latents, as the feature extractor pads
    values = torch.zeros((len(clips), 1, longest))
    mask = torch.zeros((len(clips), longest), dtype=torch.bool)
    for j, (c, n) in enumerate(zip(clips, sizes, strict=True)):
        if c.ndim == 1:
            values[j, 0, :n] = torch.from_numpy(c)
        mask[j, :n] = True
    return {"input_values": values.to(device, dtype), "padding_mask": mask.to(device)}


def speak(model: VibeVoice, request: Request, max_frames: int | None, seed: int) -> Speech:
    """See :meth:`VibeVoice.speak`."""
    try:
        turns, labels = parse_script(request.text)
    except ScriptError as e:
        raise RequestError(f"the script cannot be read: {e}") from None
    prompts = voice_prompts(model, request, labels)
    stored = [prompts[i] for i in sorted(prompts) if prompts[i].ndim == 2]
    if stored and len(stored) < len(prompts):  # some clips as audio: all go through the encoders
        prompts, stored = {i: waveform(model, c) for i, c in prompts.items()}, []
    ids = model.maker.prompt_ids(turns, {i: model.maker.count(c) for i, c in prompts.items()})
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
              **_audio_inputs(prompts, model.maker.hop, device, next(net.model.audio_tower.parameters()).dtype),
              "sample": False, "noise_scheduler": CosineVSchedule(),
              "num_diffusion_steps": model.settings["diffusion_steps"],
              "guidance_scale": model.settings["guidance_scale"], "max_new_tokens": limit, "eos_token_id": eos,
              "pad_token_id": eos, "return_dict_in_generate": True}
    devices = [device] if device.type == "cuda" else []
    was_training = net.training
    net.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                stored_features(net, stored) if stored else nullcontext():
            torch.manual_seed(seed)
            out = model.module.generate_speech(**kwargs)
    finally:
        net.train(was_training)
    frames = int((out.sequences[0, len(ids):] == model.maker.ids["pad"]).sum())
    audio = out.audio[0]
    wav = np.zeros(0, dtype=np.float32) if audio is None else audio.float().cpu().numpy().reshape(-1)
    return Speech(wav.astype(np.float32), SAMPLE_RATE, frames)
