"""The training forward of CSM over transformers' ``CsmForConditionalGeneration``, from precomputed Mimi codes.

transformers' model encodes audio with its own Mimi at every step and labels every turn (its processor); here the
codes come prepared and a batch says which frames are learned (:mod:`.conversation`). A position's input is its
text token's embedding, or at an audio position the sum of its frame's codebook embeddings (the end of a turn's
audio: the all-``codebook_eos`` frame), as the model's own merge builds it.

The depth decoder learns ``depth_decoder_frames`` of each example's learned frames (and its end frames), chosen
at every step by ``self.generator`` (a family generator: seeded per process, saved with the run; its draws are
made on the CPU, so any device draws the same frames). The two loss terms are summed here (cross-entropy over
the first codebook after the causal shift; over codebooks 1..K-1 of the chosen frames), not averaged as the
model's own loss is, so the loop normalises them over a whole optimizer step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxrelay.models.csm.conversation import IGNORE, depth_frames


class CsmTrainer(nn.Module):
    """``csm``: a ``CsmForConditionalGeneration``; ``share``: model.depth_decoder_frames."""

    def __init__(self, csm: nn.Module, generator: torch.Generator, share: float) -> None:
        super().__init__()
        self.csm = csm
        self.generator = generator
        self.share = share

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """``train.gradient_checkpointing``: transformers' own, on the backbone and depth decoder layers."""
        self.csm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def embed(self, input_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Input embeddings [B, S, H]: text ids' (``embed_text_tokens``), or an audio position's frame's."""
        config = self.csm.config
        is_audio = (input_ids == config.audio_token_id) | (input_ids == config.audio_eos_token_id)
        text = self.csm.embed_text_tokens(input_ids.masked_fill(is_audio, 0))  # markers may lie beyond the text ids
        audio = self.csm.backbone_model.embed_tokens(codes)
        return torch.where(is_audio[..., None], audio, text)

    def depth_labels(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``labels`` with codebooks 1..K-1 left out (-100) but at the frames the depth decoder learns this step."""
        config = self.csm.config
        learned = labels[..., 0] != IGNORE
        keep = learned & (input_ids == config.audio_eos_token_id)
        frames = (learned & (input_ids == config.audio_token_id)).cpu()
        for b in range(len(labels)):
            where = frames[b].nonzero()[:, 0]
            chosen = torch.randperm(len(where), generator=self.generator)[:depth_frames(len(where), self.share)]
            keep[b, where[chosen].to(keep.device)] = True
        out = labels.clone()
        out[..., 1:][~keep] = IGNORE
        return out

    def forward(self, input_ids: torch.Tensor, codes: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The summed cross-entropies ``backbone`` and ``depth`` of a batch (float32): the model's own forward with
        labels, taken apart so that its losses (a second pass over the logits) are not computed beside these."""
        csm = self.csm
        labels = self.depth_labels(input_ids, labels)
        hidden = csm.backbone_model(inputs_embeds=self.embed(input_ids, codes), attention_mask=attention_mask,
                                    use_cache=False)[0]
        logits = csm.lm_head(hidden)
        vocab = logits.shape[-1]
        backbone = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), labels[:, 1:, 0].reshape(-1),
                                   ignore_index=IGNORE, reduction="sum")
        learned = ~(labels[..., 1:] == IGNORE).all(-1)  # the depth decoder's frames, in the model's order
        frames = labels[learned]  # [N, K]
        where = learned.nonzero(as_tuple=True)
        # a frame's codes 0..K-2 after the backbone's state one position earlier (position 0's input: a placeholder)
        depth_inputs = F.pad(frames[:, :-1], (1, 0), value=0)
        out = csm.depth_decoder(input_ids=depth_inputs, backbone_last_hidden_state=hidden[where[0], where[1] - 1],
                                use_cache=False, return_dict=True)
        depth = F.cross_entropy(out.logits.reshape(-1, vocab).float(), frames[:, 1:].reshape(-1),
                                ignore_index=IGNORE, reduction="sum")
        return {"backbone": backbone, "depth": depth}

    def generate_speech(self, input_ids: torch.Tensor, codes: torch.Tensor, attention_mask: torch.Tensor,
                        **kwargs) -> torch.Tensor:
        """``csm.generate`` from a prompt of text and frames, through this module (under FSDP2 a registered
        forward method: the sharded parameters are gathered for the whole generation); codes [B, frames, K]."""
        return self.csm.generate(inputs_embeds=self.embed(input_ids, codes), attention_mask=attention_mask,
                                 **kwargs)
