"""CSM synthesis: a dialogue turn by turn, each after the previous turns (text and generated audio) as context,
through transformers' ``CsmForConditionalGeneration.generate`` (the backbone picks a frame's first codebook, the
depth decoder the others)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from voxrelay.models.base import Request, RequestError, Speech
from voxrelay.models.csm import conversation as cv

log = logging.getLogger(__name__)


def turns_of(model: Any, request: Request) -> list[tuple[str, str]]:
    """(speaker id, text) per turn: plain text in ``request.speaker``'s voice, or a script's turns, ``Speaker N:``
    as speaker id N and ``[SPEAKER_X]`` tags in letter order (A: 0, B: 1, ...). A model that knows its voices
    (``speakers``) refuses an id that is none of theirs, naming them."""
    from voxrelay.models.vibevoice.script import ScriptError, parse_script

    try:
        turns, labels = parse_script(request.text)
    except ScriptError as e:
        raise RequestError(f"the text is not a dialogue script CSM can read: {e}") from None
    if labels == [""]:  # plain text
        return [(cv.role(request.speaker, model.speakers), turns[0].text)]
    if request.speaker is not None and request.speaker != (model.speakers or [None])[0]:  # not synthesize's default
        log.warning("a script names the speaker of each turn (Speaker N:): voice %r does not apply to it; give the "
                    "text alone to speak it in that voice", request.speaker)
    ids = [label if label.isdigit() else str(rank) for rank, label in enumerate(labels)]
    known = {cv.role(s, model.speakers): s for s in model.speakers}
    unknown = [i for i in ids if known and i not in known]
    if unknown:
        voices = ", ".join(f"Speaker {i}: = {name}" for i, name in sorted(known.items()))
        raise RequestError(f"Speaker {unknown[0]}: is none of this model's voices ({voices})")
    return [(ids[t.speaker], t.text) for t in turns]


def speak_turns(model: Any, request: Request, codec: Any, max_frames: int | None, temperature: float,
                top_k: int | None, seed: int) -> Speech:
    """Each turn's codes generated after the previous ``context_turns`` turns, decoded by ``codec``, end to end."""
    talks, context, wavs, frames = model.talks, [], [], 0
    was_training = model.module.training
    model.module.eval()
    try:
        for i, (role, text) in enumerate(turns_of(model, request)):
            parts = [talks.segment(t, r, c, False) for r, t, c in context[-talks.context_turns:]] \
                if talks.context_turns else []
            parts.append(talks.segment(text, role, None, False))
            codes = generate(model, cv.join(parts), max_frames, temperature, top_k, seed + i)
            context.append((role, text, codes))
            frames += codes.shape[1]
            wavs.append(codec.decode(codes) if codes.shape[1] else np.zeros(0, dtype=np.float32))
    finally:
        model.module.train(was_training)
    return Speech(np.concatenate(wavs).astype(np.float32), int(codec.sample_rate), frames)


@torch.no_grad()
def generate(model: Any, prompt: dict[str, np.ndarray], max_frames: int | None, temperature: float,
             top_k: int | None, seed: int) -> np.ndarray:
    """Codes int64 [K, T] after ``prompt`` (:func:`~voxrelay.models.csm.conversation.join`'s arrays), without the
    end frame; at most ``max_frames`` (None: what ``max_seq_len`` leaves). Ids beyond the codebook (CSM's padding
    ids) are never drawn: Mimi cannot decode them."""
    config = model.csm.config
    device = next(model.module.parameters()).device
    room = model.max_length - len(prompt["input_ids"])
    if room < 1:
        raise RequestError(f"the text and context take {len(prompt['input_ids'])} positions, leaving no room for a "
                           f"frame in model.max_seq_len={model.max_length}; shorten the text")
    budget = room if max_frames is None else max(1, min(max_frames, room))
    size = config.vocab_size - 3  # the codes; the rest of the vocabulary is padding and specials
    sample = temperature > 0
    how: dict[str, Any] = {"do_sample": sample, "depth_decoder_do_sample": sample,
                           "suppress_tokens": list(range(size, config.vocab_size)),
                           "depth_decoder_suppress_tokens": list(range(size, config.vocab_size))}
    if sample:  # depth_decoder_* settings persist in its generation config: every call sets them all
        how |= {"temperature": temperature, "top_k": top_k or 0, "depth_decoder_temperature": temperature,
                "depth_decoder_top_k": top_k or 0}
    ids = torch.from_numpy(prompt["input_ids"])[None].to(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        out = model.module.generate_speech(input_ids=ids, codes=torch.from_numpy(prompt["codes"])[None].to(device),
                                           attention_mask=torch.ones_like(ids), max_new_tokens=budget, **how)
    codes = out[0].cpu().numpy()  # [frames, K], the end frame included when it stopped
    end = np.flatnonzero((codes[:, :-1] == config.codebook_eos_token_id).all(-1))
    return (codes[: end[0]] if len(end) else codes).T.astype(np.int64)
