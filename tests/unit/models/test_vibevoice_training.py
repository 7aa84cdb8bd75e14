"""The ``vibevoice`` family's training path on a tiny random VibeVoice: each of the five defects of transformers'
built-in training path is avoided (FACTS.md), the noise schedule and sampler are diffusers' (golden values),
the noise comes from the family generator, the EMA swaps in and out, memory stays flat."""

from __future__ import annotations

import gc

import numpy as np
import psutil
import pytest
import torch

from tests.helpers.vibevoice import save_tiny_vibevoice
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import DataSpec, pop_counts
from voxrelay.models.registry import build_model
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig
from voxrelay.models.vibevoice.schedule import CosineVSchedule

PCM = PcmCodec(24000)


def _row(i: int, text: str, speaker: str | None, seconds: float) -> EncodedUtterance:
    t = np.arange(int(seconds * 24000)) / 24000
    wav = 0.3 * np.sin(2 * np.pi * (110 + 37 * i) * t) * (1 + 0.5 * np.sin(2 * np.pi * (2 + i) * t))
    return EncodedUtterance(f"r{i}", text, speaker, None, seconds, PCM.encode(wav).astype(np.int16))


ROWS = [_row(0, "[SPEAKER_A] Hello there.\n[SPEAKER_B] Hi, how are you?", "a,b", 2.0),
        _row(1, "[SPEAKER_A] One voice.", "a", 1.0), _row(2, "[SPEAKER_A] The other voice.", "b", 0.9)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_vibevoice(tmp_path_factory.mktemp("vv") / "tiny")


def _model(checkpoint, **settings):
    cfg = VibeVoiceFamilyConfig(init_from=str(checkpoint), max_length=1024, voice_prompt_drop_rate=0.0, **settings)
    model = build_model(cfg, DataSpec(1, 65536, [], 24000.0, 24000), seed=0)
    model.use_corpus(ROWS)
    return model


def _latents(model, audio: torch.Tensor) -> torch.Tensor:
    """The scaled σ-VAE means of one clip [1, N] (no noise), [T, D]."""
    with torch.no_grad():
        mean = model.net.model.audio_tower.encoder(audio[:, None]).latents
    return model.module.latents(mean, sample=False)[0]


def _batch(model, rows=ROWS[:1]):
    batch = model.collate([model.example(r) for r in rows])
    return batch, pop_counts(batch)


def test_the_example_has_prompts_of_other_clips_and_the_target_span_as_ce_targets(checkpoint):
    model = _model(checkpoint)
    e = model.example(ROWS[0])
    ids, pad, hop = model.maker.ids, model.maker.ids["pad"], model.maker.hop
    assert [len(c) for c in e["clips"]] == [24000, 21600, 48000] and list(e["is_target"]) == [False, False, True]
    targets = e["labels"][e["labels"] != -100]
    n = 48000 // hop
    # defect 1: the audio tokens are targets, then end of speech, end of text
    assert targets.tolist() == [pad] * n + [ids["end"], ids["eos"]]
    assert (e["input_ids"] == pad).sum() == 8 + 7 + n  # the prompts' latents (1 s, 0.9 s) and the target's
    text = model.maker.tokenizer.decode(e["input_ids"][e["input_ids"] != pad])
    assert " Voice input:\n Speaker 0:<|vision_start|><|vision_end|>\n Speaker 1:" in text
    assert text.endswith(" Speaker 1: Hi, how are you?\n Speech output:\n<|vision_start|><|vision_end|><|endoftext|>")
    assert model.length(ROWS[0]) == len(e["input_ids"])
    alone = model.example(ROWS[1])  # its voice's only other clip is itself: no prompt
    assert len(alone["clips"]) == 1 and " Voice input:" not in model.maker.tokenizer.decode(alone["input_ids"])


def _captured(model, batch):
    seen = {}
    original = model.module.diffusion_sum

    def capture(x0, condition):
        seen["x0"], seen["condition"] = x0.detach().clone(), condition.detach().clone()
        return original(x0, condition)

    model.module.diffusion_sum = capture
    try:
        out = model.module(**batch)
    finally:
        del model.module.diffusion_sum
    return seen, out


def test_the_diffusion_loss_covers_the_target_latents_only(checkpoint):
    """Defect 2: the diffusion targets are exactly the target clip's latents (prompts' excluded)."""
    model = _model(checkpoint)
    model.net.model.audio_tower.config.vae_std = 0.0  # no σ-VAE noise: latents comparable exactly
    batch, counts = _batch(model)
    seen, out = _captured(model, batch)
    target = batch["audio"][-1:, :]
    expected = _latents(model, target)
    assert torch.allclose(seen["x0"], expected, atol=1e-6)
    assert counts["diffusion"] == expected.shape[0] * model.settings["ddpm_batch_multiplier"]
    assert int(out["diffusion_count"]) == counts["diffusion"] and int(out["ce_count"]) == counts["ce"]


def test_the_condition_of_latent_p_never_sees_latent_p(checkpoint):
    """Defect 3: changing the target's last latent (its last 3200 samples; the σ-VAE is causal) changes no
    condition: latent p is conditioned on the hidden state at p - 1, as generation does."""
    model = _model(checkpoint, dropout=0.0)
    model.net.model.audio_tower.config.vae_std = 0.0
    model.module.eval()
    batch, _ = _batch(model)
    first, _ = _captured(model, batch)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["audio"][-1, 48000 - 3200:48000] *= -3.0
    changed["audio_key"][-1] += 1  # another clip (the encoders' cache holds the first one's features)
    assert not torch.equal(_latents(model, changed["audio"][-1:])[-1], _latents(model, batch["audio"][-1:])[-1])
    second, _ = _captured(model, changed)
    assert torch.allclose(first["condition"], second["condition"], atol=1e-6)
    assert not torch.allclose(first["x0"][-1], second["x0"][-1])


def test_target_latents_get_semantic_features_and_prompts_do_not(checkpoint):
    """Defect 4: a target latent's input embedding is acoustic + semantic (as generation feeds back a latent)."""
    model = _model(checkpoint)
    inner = model.net.model
    batch, _ = _batch(model)
    with torch.no_grad():
        embeds, lat, target = model.module.audio_embeddings(batch["audio"], batch["audio_len"], batch["audio_key"],
                                                            batch["audio_is_target"], sample=False)
        acoustic = inner.multi_modal_projector(lat)
        semantic = inner.semantic_connector(inner.semantic_tokenizer_encoder(batch["audio"][-1:, None]).latents)[0]
    assert torch.allclose(embeds[~target], acoustic[~target], atol=1e-6)
    assert torch.allclose(embeds[target], acoustic[target] + semantic[: int(target.sum())], atol=1e-5)


def test_timesteps_cover_the_whole_schedule_and_come_from_the_family_generator(checkpoint):
    """Defect 5 (the built-in samples steps 0-9 of 1000); the draws are the generator's: the same state gives
    the same loss, another state another one."""
    model = _model(checkpoint)
    drawn = []
    original = torch.randint

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        drawn.append(out)
        return out

    batch, _ = _batch(model)
    torch.randint = spy
    try:
        for _ in range(20):
            model.module(**batch)
    finally:
        torch.randint = original
    steps = torch.cat(drawn)
    assert steps.min() < 100 and steps.max() > 900
    model.module.eval()
    state = model.module.generator.get_state()
    a = model.module(**batch)["diffusion_sum"]
    model.module.generator.set_state(state)
    b = model.module(**batch)["diffusion_sum"]
    assert torch.equal(a, b) and not torch.equal(a, model.module(**batch)["diffusion_sum"])


def _train_counting_encodes(checkpoint, cache_gb: float, steps: int = 3):
    """(losses, encoder calls per step, trained weights) of ``steps`` steps over ROWS (row 0 takes rows 1 and 2 as
    its prompts; rows 1 and 2 are also targets themselves)."""
    torch.manual_seed(0)
    model = _model(checkpoint, feature_cache_gb=cache_gb)
    calls: list[int] = []
    for part in (model.net.model.audio_tower.encoder, model.net.model.semantic_tokenizer_encoder):
        part.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[-1]))
    params = [p for p in model.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    losses, per_step = [], []
    for _ in range(steps):
        batch, _ = _batch(model, ROWS)
        before = len(calls)
        terms = model.loss(model.module, batch)
        loss = sum(t.sum / t.count for t in terms.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        per_step.append(len(calls) - before)
    return losses, per_step, [p.detach().clone() for p in params]


def test_the_encoders_run_once_per_clip_and_cached_features_train_identically(checkpoint):
    """The frozen encoders' outputs are cached per clip (model.feature_cache_gb): after the first step nothing is
    encoded, and the run's losses and weights equal, bit for bit, those of a run that encodes at every step."""
    plain_losses, plain_calls, plain_weights = _train_counting_encodes(checkpoint, 0.0)
    losses, calls, weights = _train_counting_encodes(checkpoint, 1.0)
    # 5 clips (2 prompts + 3 targets) through the σ-VAE and 3 targets through the semantic encoder, every step;
    # with the cache, 3 distinct clips + 3 targets once (row 1's clip as a prompt and as a target: one encode)
    assert plain_calls == [8, 8, 8] and calls == [6, 0, 0]
    assert losses == plain_losses and len(set(losses)) == 3
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights, strict=True))


def test_gradient_checkpointing_with_activation_offload_leaves_the_gradients_unchanged(checkpoint):
    """train.gradient_checkpointing checkpoints the LM's decoder layers (transformers' own, on ``net``); with
    train.activation_offload their inputs go out to a host copy and back (HostCopies: what a GPU does). The
    gradients equal a plain backward's to the bit, dropout on, and only the 2 layers' inputs went through."""
    from tests.helpers.peak import HostCopies
    from voxrelay.train.offload import offload_checkpoints, offloads
    from voxrelay.train.strategies import enable_gradient_checkpointing

    def grads(model):
        model.module.train()  # dropout on, and layers checkpoint only in training
        batch, _ = _batch(model)
        torch.manual_seed(3)
        sum(t.sum for t in model.loss(model.module, batch).values()).backward()
        return {n: p.grad for n, p in model.module.named_parameters() if p.grad is not None}, batch

    plain, _ = grads(_model(checkpoint, dropout=0.1))
    model = _model(checkpoint, dropout=0.1)
    enable_gradient_checkpointing(model, True, offload=True)
    hooks = HostCopies()
    assert offloads(model.module) and offload_checkpoints(model.module, hooks)
    checkpointed, batch = grads(model)
    assert checkpointed.keys() == plain.keys()
    assert all(torch.equal(checkpointed[n], plain[n]) for n in plain)
    hidden = model.net.config.text_config.hidden_size
    assert hooks.packed_bytes == hooks.unpacked_bytes == 2 * batch["input_ids"].numel() * hidden * 4


def test_the_schedule_and_sampler_are_diffusers_dpm_solver_plus_plus():
    """Golden values from diffusers 0.42.1's DPMSolverMultistepScheduler(beta_schedule="squaredcos_cap_v2",
    prediction_type="v_prediction"), 10 steps, with v = tanh(x W) + t / 1000."""
    s = CosineVSchedule()
    assert torch.allclose(s.alpha_t[[0, 250, 500, 750, 999]], torch.tensor([0.999979, 0.919722, 0.70163,
                                                                            0.37839, 4.9e-05]), atol=2e-6)
    assert torch.allclose(s.sigma_t[[0, 250, 500, 750, 999]], torch.tensor([0.006427, 0.392571, 0.712541,
                                                                            0.925646, 1.0]), atol=2e-6)
    torch.manual_seed(0)
    weight = torch.randn(8, 8) * 0.3
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    s.set_timesteps(10)
    for t in s.timesteps:
        x = s.step(torch.tanh(x @ weight) + float(t) / 1000, t, x).prev_sample
    golden = [-3.570190668106079, -2.744208574295044, -0.052218854427337646, -0.8194385170936584,
              -0.6328509449958801, -0.2723309397697449, -0.25091245770454407, -3.885471820831299,
              -2.492584466934204, -1.9523706436157227, -1.3163135051727295, -0.7875093817710876,
              0.1038835346698761, 0.7494824528694153, 0.31256264448165894, -0.5470017194747925]
    assert torch.allclose(x.flatten(), torch.tensor(golden), atol=1e-5)


def test_ce_training_teaches_the_lm_to_keep_emitting_audio_then_end(checkpoint):
    """After CE steps on one example, the teacher-forced argmax over the target span is audio token after audio
    token, then end of speech and end of text: the LM does not learn to end speech at once."""
    model = _model(checkpoint, dropout=0.0, diffusion_loss_weight=0.0)
    batch, _ = _batch(model)
    params = [p for p in model.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3)
    for _ in range(60):
        terms = model.loss(model.module, batch)
        optimizer.zero_grad()
        (terms["ce"].sum / terms["ce"].count).backward()
        optimizer.step()
    net, ids = model.net, batch["input_ids"]
    with torch.no_grad():
        inputs = net.get_input_embeddings()(ids).clone()
        embeds, _, _ = model.module.audio_embeddings(batch["audio"], batch["audio_len"], batch["audio_key"],
                                                     batch["audio_is_target"], sample=False)
        inputs[ids == net.config.audio_token_id] = embeds
        hidden = net.model.language_model(inputs_embeds=inputs, attention_mask=batch["attention_mask"])
        predicted = net.lm_head(hidden.last_hidden_state).argmax(-1)
    start = int((ids[0] == model.maker.ids["bos"]).nonzero()[-1])  # the target's <|vision_start|>
    n = int(batch["audio_len"][-1]) // model.maker.hop
    expected = [model.maker.ids["pad"]] * n + [model.maker.ids["end"], model.maker.ids["eos"]]
    assert predicted[0, start:-1].tolist() == expected


def test_the_ema_follows_the_head_and_is_swapped_in_and_out(checkpoint):
    model = _model(checkpoint, ema_decay=0.5)
    head = model.net.model.diffusion_head.cond_proj.weight
    before = head.detach().clone()
    model.after_optimizer_step()  # first step: the EMA starts at the weights
    with torch.no_grad():
        head.add_(1.0)
    model.after_optimizer_step()
    ema = model.extra_state()["ema.diffusion_head.cond_proj.weight"]
    assert torch.allclose(ema, before + 0.5)
    with model.eval_weights():
        assert torch.allclose(head, before + 0.5)
        with model.eval_weights():  # re-entrant
            assert torch.allclose(head, before + 0.5)
    assert torch.allclose(head, before + 1.0)
    other = _model(checkpoint, ema_decay=0.5)
    other.load_extra_state(model.extra_state())
    with other.eval_weights():
        assert torch.allclose(other.net.model.diffusion_head.cond_proj.weight, before + 0.5)
    with pytest.raises(ValueError, match="does not keep"):
        other.load_extra_state({"nope": torch.zeros(1)})


def test_memory_stays_flat_over_many_steps(checkpoint):
    """The community trainer's memory creeps up over a run; here the RSS after 40 more steps is what it was
    after the first 10 (within allocator noise)."""
    model = _model(checkpoint)
    examples = [model.example(r) for r in ROWS]
    params = [p for p in model.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)

    def steps(n: int) -> None:
        for i in range(n):
            batch = model.collate(examples[i % 3:] + examples[: i % 3])
            pop_counts(batch)
            terms = model.loss(model.module, batch)
            optimizer.zero_grad()
            sum(t.weight * t.sum / t.count for t in terms.values()).backward()
            optimizer.step()
            model.after_optimizer_step()

    process = psutil.Process()
    steps(10)
    gc.collect()
    early = process.memory_info().rss
    steps(40)
    gc.collect()
    late = process.memory_info().rss
    assert late - early < 30 * 2**20, (early / 2**20, late / 2**20)  # a kept graph per step grows by MBs


def test_fp32_weights_train_under_bf16_autocast(checkpoint):
    """transformers' own forward fails here (masked_scatter of bf16 features into fp32 embeddings)."""
    model = _model(checkpoint)
    batch, _ = _batch(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = model.loss(model.module, batch)
    total = sum(t.weight * t.sum / t.count for t in terms.values())
    total.backward()
    assert torch.isfinite(total) and all(p.grad is not None for p in model.module.parameters() if p.requires_grad)


def test_a_lora_base_in_bf16_trains_its_float32_adapters_and_head_under_bf16_autocast(checkpoint):
    """train.lora's default weights_dtype (auto) under bf16: the frozen base in bf16, the adapters and the diffusion
    head (modules_to_save) in float32, every one of them reached by the gradient (issue 34 item 2)."""
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.train.strategies import apply_lora

    model = _model(checkpoint, weights_dtype="bfloat16")
    apply_lora(model, LoraConfig(r=4))
    trained = {n: p for n, p in model.module.named_parameters() if p.requires_grad}
    assert {p.dtype for p in trained.values()} == {torch.float32}
    assert any("diffusion_head" in n and "modules_to_save" in n for n in trained)
    assert {p.dtype for p in model.module.parameters() if not p.requires_grad} == {torch.bfloat16}
    batch, _ = _batch(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        terms = model.loss(model.module, batch)
    total = sum(t.weight * t.sum / t.count for t in terms.values())
    total.backward()
    assert torch.isfinite(total) and all(p.grad is not None for p in trained.values())


def test_voices_without_another_clip_are_named(checkpoint, caplog):
    model = _model(checkpoint)
    with caplog.at_level("WARNING"):
        model.use_corpus(ROWS)
    assert "2 voice(s) have fewer than 2 one-voice clips" in caplog.text and "a, b" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        model.use_corpus([_row(5, "Plain text.", None, 1.0)])
    assert "1 of 1 training rows have no voice prompts" in caplog.text and "`voice_prompts` column" in caplog.text


@pytest.mark.parametrize(("preset", "billions"), [("1.5B", 2.70), ("7B", 9.34)])
def test_plan_builds_the_released_sizes_without_a_download(preset, billions):
    from voxrelay.models.vibevoice.loading import meta_net

    net = meta_net("vibevoice/VibeVoice-7B-hf", preset, 0.0)
    assert round(sum(p.numel() for p in net.parameters()) / 1e9, 2) == billions
    assert not any(p.requires_grad for n, p in net.named_parameters() if "audio_tower" in n or "semantic_tok" in n)
