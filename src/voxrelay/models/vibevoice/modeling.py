"""The training forward of VibeVoice, over transformers' ``VibeVoiceForConditionalGeneration`` parts but not its
built-in loss, which spoils a fine-tune five ways (see ``FACTS.md``). Here:

1. the CE targets keep the audio tokens (``<|vision_pad|>``), so the LM learns to go on emitting speech and
   when to end it (``<|vision_end|>``, then end of text);
2. the diffusion loss covers the target latents only, never the voice prompts';
3. the diffusion condition of latent p is the hidden state one position earlier (whose logits emitted its audio
   token), as generation does, never the position whose input is latent p itself;
4. a target latent's input embedding is acoustic + semantic features, as generation feeds back a generated
   latent (voice prompts: acoustic only, as generation's prefill);
5. timesteps are drawn over the whole 1000-step schedule.

σ-VAE noise, diffusion noise and timesteps come from ``self.generator`` (a family generator: seeded per process,
saved with the run). Every draw is made on the CPU, so a run draws the same numbers on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxrelay.models.linear_ce import MATERIALISED, head_loss
from voxrelay.models.vibevoice.schedule import CosineVSchedule


class FeatureCache:
    """The frozen encoders' outputs per clip (``part``, clip key), kept in CPU memory up to ``limit_bytes``
    (then clips beyond it are encoded at every step): they are pure functions of the clip, so a run pays the
    encoders once per clip instead of at every step (``model.feature_cache_gb``)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.held: dict[tuple[str, int], torch.Tensor] = {}
        self.used = 0

    def get(self, part: str, key: int) -> torch.Tensor | None:
        return self.held.get((part, key))

    def put(self, part: str, key: int, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if self.used + size <= self.limit_bytes and (part, key) not in self.held:
            self.held[(part, key)] = value.detach().to("cpu", copy=True)
            self.used += size


class VibeVoiceTrainer(nn.Module):
    """``net``: a ``VibeVoiceForConditionalGeneration``. :meth:`forward` returns the sums and counts of the two
    loss terms (``ce``, ``diffusion``) of a batch made by :func:`voxrelay.models.vibevoice.examples.collate`."""

    def __init__(self, net: nn.Module, ddpm_batch_multiplier: int, generator: torch.Generator,
                 cache: FeatureCache | None = None):
        super().__init__()
        self.net = net
        self.ddpm_batch_multiplier = ddpm_batch_multiplier
        self.generator = generator
        self.schedule = CosineVSchedule()
        self.cache = cache if cache is not None else FeatureCache(0)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None) -> None:
        """``train.gradient_checkpointing``: transformers' own, on ``net`` (its language model's decoder layers; the
        frozen encoders run without gradients and the diffusion head is small)."""
        self.net.activation_checkpointing_enable(activation_checkpointing_kwargs=activation_checkpointing_kwargs)

    def generate_speech(self, **kwargs):
        """``net.generate`` through this module, so that under FSDP2 (a registered forward method) the root's
        sharded parameters are gathered for the whole generation."""
        return self.net.generate(**kwargs)

    def decode_means(self, means: torch.Tensor) -> torch.Tensor:
        """Audio [1, 1, N] of σ-VAE means [1, T, D] (stored latents as a voice prompt's waveform), through this
        module: under FSDP2 a registered forward method, so the tower's parameters are gathered."""
        tower = self.net.model.audio_tower
        param = next(tower.parameters())
        return tower.decode(means.to(param.device, param.dtype)).audio

    def _draw_normal(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator).to(like.device, like.dtype)

    def encode(self, part: str, clip: torch.Tensor, key: int) -> torch.Tensor:
        """The frozen encoder ``part`` (``acoustic``: the σ-VAE's means; ``semantic``) on one clip [N] (a whole
        number of latents), [N / hop, D]: from the cache when it holds it. Each clip is encoded alone, so its
        features do not depend on the batch it comes in (a resumed run gets the values a straight run had)."""
        found = self.cache.get(part, key)
        if found is not None:
            return found.to(clip.device)
        model = self.net.model
        encoder = model.audio_tower.encoder if part == "acoustic" else model.semantic_tokenizer_encoder
        with torch.no_grad():
            out = encoder(clip[None, None]).latents[0]
        self.cache.put(part, key, out)
        return out

    def features(self, audio: torch.Tensor, audio_len: torch.Tensor, audio_key: torch.Tensor,
                 is_target: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(σ-VAE means [A, T, D] of every clip, zero-padded to the batch's T = samples / hop; semantic features
        [T_j, Ds] of each target clip, in order). ``audio`` [A, T, D + Ds]: the encoders' outputs as prepare stored
        them (``codec.type: vibevoice_latents``), taken as they are."""
        hop = self.net.model.config.audio_config.hop_length
        count = ((audio_len + hop - 1) // hop).tolist()
        if audio.ndim == 3:
            return self.stored_features(audio, count, is_target)
        means, semantic = [], []
        for j, n in enumerate(count):
            clip, key = audio[j, : n * hop], int(audio_key[j])
            means.append(self.encode("acoustic", clip, key))
            if bool(is_target[j]):
                semantic.append(self.encode("semantic", clip, key))
        width = audio.shape[1] // hop
        padded = torch.zeros((len(means), width, means[0].shape[-1]), dtype=means[0].dtype, device=audio.device)
        for j, m in enumerate(means):
            padded[j, : m.shape[0]] = m
        return padded, semantic

    def stored_features(self, stored: torch.Tensor, count: list[int], is_target: torch.Tensor
                        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`features` from stored encoder outputs, in the dtype and memory layout the encoders give them
        (channel-major [T, D] views: the connector's matmul then sums in the same order, so a run on stored
        latents equals a run on the audio bit for bit)."""
        model = self.net.model
        width = int(model.config.audio_config.hidden_size)
        stored = stored.to(next(model.audio_tower.parameters()).dtype)
        semantic = [stored[j, :n, width:].T.contiguous().T for j, n in enumerate(count) if bool(is_target[j])]
        return stored[:, :, :width].contiguous(), semantic

    def latents(self, mean: torch.Tensor, sample: bool) -> torch.Tensor:
        """Scaled acoustic latents [A, T, D] from the σ-VAE's means; with ``sample`` its noise: a std drawn per
        clip from N(0, vae_std), times N(0, 1) per value."""
        inner = self.net.model
        if sample:
            std = inner.audio_tower.config.vae_std * torch.randn(mean.shape[0], generator=self.generator)
            mean = mean + std.to(mean.device, mean.dtype)[:, None, None] * self._draw_normal(mean.shape, mean)
        return (mean + inner.latent_bias_factor) * inner.latent_scaling_factor

    def audio_embeddings(self, audio: torch.Tensor, audio_len: torch.Tensor, audio_key: torch.Tensor,
                         is_target: torch.Tensor, sample: bool = True) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor]:
        """(input embeddings [n, H], scaled latents [n, D], is-target [n]) of every valid latent of every clip, in
        order: clip by clip, each clip's latents in time order (the order of the placeholders)."""
        inner = self.net.model
        mean, semantic = self.features(audio, audio_len, audio_key, is_target)
        lat = self.latents(mean, sample)
        hop = inner.config.audio_config.hop_length
        count = (audio_len + hop - 1) // hop
        valid = torch.arange(lat.shape[1], device=lat.device)[None, :] < count.to(lat.device)[:, None]
        embeds = inner.multi_modal_projector(lat)
        if semantic:  # the semantic encoder's features go to the target clips only (prompts get none)
            embeds = embeds.clone()
            rows = torch.nonzero(is_target.to(embeds.device)).reshape(-1).tolist()
            for j, feats in zip(rows, semantic, strict=True):
                embeds[j, : feats.shape[0]] += inner.semantic_connector(feats.to(embeds.dtype))
        target = is_target.to(lat.device)[:, None].expand_as(valid)[valid]
        return embeds[valid], lat[valid], target

    def diffusion_sum(self, x0: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """Sum over target latents and noise draws of the per-latent mean squared v-prediction error."""
        mult = self.ddpm_batch_multiplier
        x0 = x0.repeat_interleave(mult, dim=0)
        condition = condition.repeat_interleave(mult, dim=0)
        noise = self._draw_normal(tuple(x0.shape), x0)
        steps = torch.randint(0, self.schedule.num_train_timesteps, (x0.shape[0],), generator=self.generator)
        steps = steps.to(x0.device)
        noisy = self.schedule.add_noise(x0, noise, steps)
        predicted = self.net.model.diffusion_head(noisy, steps.to(x0.dtype), condition)
        target = self.schedule.v_target(x0, noise, steps)
        return F.mse_loss(predicted.float(), target.float(), reduction="none").mean(dim=-1).sum()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                audio: torch.Tensor, audio_len: torch.Tensor, audio_key: torch.Tensor,
                audio_is_target: torch.Tensor, loss_kernel: str = MATERIALISED,
                loss_chunk_tokens: int = 256) -> dict[str, torch.Tensor]:
        net = self.net
        placeholders = input_ids == net.config.audio_token_id
        embeds, lat, target = self.audio_embeddings(audio, audio_len, audio_key, audio_is_target, sample=True)
        if int(placeholders.sum()) != embeds.shape[0]:
            raise ValueError(f"{int(placeholders.sum())} audio placeholders but {embeds.shape[0]} latents")
        inputs = net.get_input_embeddings()(input_ids)
        inputs = inputs.clone()
        inputs[placeholders] = embeds.to(inputs.dtype)  # index assignment: no masked_scatter dtype trap under bf16
        hidden = net.model.language_model(inputs_embeds=inputs, attention_mask=attention_mask).last_hidden_state
        keep = labels != -100
        if loss_kernel == MATERIALISED:
            logits = net.lm_head(hidden[keep])
            ce_sum = F.cross_entropy(logits.float(), labels[keep], reduction="sum")
        else:  # the head's loss a chunk of tokens at a time (train.chunked_loss): no [N, vocab] logits
            ce_sum = head_loss(hidden[keep], net.lm_head, labels[keep], loss_kernel, loss_chunk_tokens).total
        target_at = torch.zeros_like(placeholders)
        target_at[placeholders] = target
        condition_at = torch.zeros_like(target_at)
        condition_at[:, :-1] = target_at[:, 1:]  # latent p is conditioned on the hidden state at p - 1
        diffusion = self.diffusion_sum(lat[target], hidden[condition_at])
        return {"ce_sum": ce_sum, "ce_count": keep.sum(),
                "diffusion_sum": diffusion, "diffusion_count": target.sum() * self.ddpm_batch_multiplier}
