"""Parler-TTS core (voxrelay.models.parler) against upstream parler-tts 0.2.3: delay pattern, loss rule,
KV-cached generation, state-dict names (incl. the DAC's weight norm), sizes, and, when
tests/fixtures/parler/ holds it, logits and loss produced by upstream's own code."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import DacConfig, DacModel

from voxrelay.models.parler import delay, keymap
from voxrelay.models.parler.generation import DelayedSampler, SamplingConfig, generate
from voxrelay.models.parler.modeling import ParlerConfig, ParlerDecoderConfig, build_parler

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "parler"
B, E = delay.BOS_ID, delay.EOS_ID
T5_TINY = dict(model_type="t5", vocab_size=64, d_model=24, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
               feed_forward_proj="gated-gelu", dropout_rate=0.0)


def tiny_config(**decoder: object) -> ParlerConfig:
    """9 codebooks, GQA self-attention (2 kv heads of 4), one cross-attention kv head, T5 width != decoder's."""
    fields = dict(num_codebooks=9, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=48,
                  num_key_value_heads=2, num_cross_attention_key_value_heads=1, max_position_embeddings=128)
    fields.update(dropout=0.0, **decoder)
    return ParlerConfig(text_encoder=T5_TINY, decoder=ParlerDecoderConfig(**fields), prompt_vocab_size=40)


def batch_inputs() -> dict[str, torch.Tensor]:
    """Two samples: description right-padded, transcript left-padded (as upstream trains)."""
    g = torch.Generator().manual_seed(0)
    desc_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    prompt_mask = torch.tensor([[1] * 5, [0] * 2 + [1] * 3])
    description_ids = torch.randint(2, 64, (2, 6), generator=g) * desc_mask
    prompt_ids = torch.randint(2, 40, (2, 5), generator=g) * prompt_mask
    return dict(description_ids=description_ids, description_mask=desc_mask, prompt_ids=prompt_ids,
                prompt_mask=prompt_mask)


# --- delay pattern -------------------------------------------------------------------------------------------


def test_delay_labels_hand_example() -> None:
    labels = delay.delay_labels(torch.tensor([[1, 2], [3, 4], [5, 6]]))
    assert labels.tolist() == [[1, 2, E, E, E], [B, 3, 4, E, E], [B, B, 5, 6, E]]
    batch = delay.collate_labels([labels, delay.delay_labels(torch.tensor([[7], [8], [9]]))])
    assert batch.shape == (2, 5, 3)
    assert batch[1].T.tolist() == [[7, E, E, E, -100], [B, 8, E, E, -100], [B, B, 9, E, -100]]
    inputs = delay.decoder_inputs(batch)  # shifted right, BOS first, -100 read as PAD = EOS
    assert inputs[0].T.tolist() == [[B, 1, 2, E, E], [B, B, 3, 4, E], [B, B, B, 5, 6]]
    assert inputs[1].T.tolist() == [[B, 7, E, E, E], [B, B, 8, E, E], [B, B, B, 9, E]]


@pytest.mark.parametrize("num_codebooks,frames", [(1, 1), (3, 1), (4, 2), (9, 1), (9, 5), (9, 31)])
def test_delay_round_trip(num_codebooks: int, frames: int) -> None:
    codes = torch.randint(0, 1024, (num_codebooks, frames), generator=torch.Generator().manual_seed(frames))
    labels = delay.delay_labels(codes)
    assert labels.shape == (num_codebooks, frames + num_codebooks)
    assert ((labels == E).sum(dim=1) == torch.arange(num_codebooks, 0, -1)).all()  # 1 EOS + K-1-k PAD
    generated = torch.cat([torch.full((num_codebooks, 1), B), labels], dim=1)  # as generate() returns rows
    assert torch.equal(delay.undelay(generated), codes)
    assert [c.shape[1] for c in delay.undelay_batch(torch.stack([generated, generated]))] == [frames, frames]


def test_undelay_drops_frames_holding_special_ids() -> None:
    codes = torch.arange(12).view(3, 4)
    rows = torch.cat([torch.full((3, 1), B), delay.delay_labels(codes)], dim=1)
    rows[1, 1 + 1 + 2] = 1050  # codebook 1, frame 2: an unused vocabulary id
    assert torch.equal(delay.undelay(rows), codes[:, [0, 1, 3]])


# --- loss ----------------------------------------------------------------------------------------------------


def test_loss_rule_against_hand_computation() -> None:
    labels = delay.collate_labels([delay.delay_labels(torch.tensor([[1, 2], [3, 4], [5, 6]])),
                                   delay.delay_labels(torch.tensor([[7], [8], [9]]))])
    logits = torch.randn(2, 3, 5, 1088, generator=torch.Generator().manual_seed(1))
    # targets by hand: codebook k of a T-frame sample: its codes then one EOS at steps k .. k+T
    targets = {(0, k): list(zip(range(k, k + 3), codes + [E], strict=True))
               for k, codes in enumerate([[1, 2], [3, 4], [5, 6]])}
    targets |= {(1, k): [(k, code), (k + 1, E)] for k, code in enumerate([7, 8, 9])}
    sums, counts = delay.codebook_losses(logits, labels)
    for k in range(3):
        pairs = [(b, t, y) for b in range(2) for t, y in targets[(b, k)]]
        expected = sum(-F.log_softmax(logits[b, k, t], dim=-1)[y] for b, t, y in pairs)
        assert counts[k] == len(pairs) == 5
        assert torch.allclose(sums[k], expected, atol=1e-4)
    assert torch.allclose(delay.mean_of_means(sums, counts), (sums / 5).mean())
    assert torch.allclose(delay.mean_of_means(sums, counts, [1.0, 0.0, 3.0]), (sums[0] + 3 * sums[2]) / 5 / 4)


# --- generation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope", [False, True])
def test_cached_greedy_choices_equal_full_forward_argmax(rope: bool) -> None:
    model = build_parler(tiny_config(rope_embeddings=rope), seed=3).eval()
    cond = model.encode(**batch_inputs())
    config = SamplingConfig(do_sample=False, max_length=16)
    out = generate(model, cond, config)  # KV cache: one new position per step
    replay = DelayedSampler.start(2, 9, config)
    with torch.no_grad():
        while not replay.done:  # same rules, but each step recomputes the whole prefix without a cache
            full = model.decode(replay.inputs().transpose(1, 2), cond)[:, :, -1]
            step = replay.length
            replay.append(replay.choose(replay.scores(full)))
            assert torch.equal(replay.inputs()[..., step], out.delayed[..., step]), f"step {step}"
    assert torch.equal(replay.inputs(), out.delayed)
    assert out.delayed.shape == (2, 9, 16) and (out.delayed[:, :, 0] == B).all()
    assert all(c.shape[0] == 9 and c.shape[1] <= 16 - 9 and (c < 1024).all() for c in out.codes)
    seeded = [generate(model, cond, SamplingConfig(max_length=12, seed=5)).delayed for _ in range(2)]
    assert torch.equal(seeded[0], seeded[1])


def test_eos_follows_the_delay_order() -> None:
    """EOS as the top logit everywhere: banned for the first K+1 new steps, then codebook k ends one step
    after codebook k-1, and the rows are exactly a delayed utterance of K+1 frames."""
    k_books, vocab = 4, 1088
    logits = torch.zeros(1, k_books, vocab)
    logits[..., 7], logits[..., E] = 1.0, 2.0
    sampler = DelayedSampler.start(1, k_books, SamplingConfig(do_sample=False, max_length=50))
    while not sampler.done:
        sampler.append(sampler.choose(sampler.scores(logits)))
    rows = sampler.inputs()[0]
    first_eos = [int((row == E).nonzero()[0]) for row in rows]
    assert first_eos == [k_books + 2 + k for k in range(k_books)]
    codes = delay.undelay(rows)
    assert codes.shape == (k_books, k_books + 1) and (codes == 7).all()
    assert torch.equal(rows, torch.cat([torch.full((k_books, 1), B), delay.delay_labels(codes)], dim=1))


# --- state-dict names ----------------------------------------------------------------------------------------


def tiny_dac() -> DacModel:
    config = DacConfig(encoder_hidden_size=8, downsampling_ratios=[2, 2], decoder_hidden_size=32,
                       upsampling_ratios=[2, 2], n_codebooks=3, codebook_size=16, codebook_dim=4, hidden_size=16,
                       hop_length=4)
    torch.manual_seed(0)
    return DacModel(config).eval()


def test_keymap_round_trip_fused_heads_tied_t5_and_sinusoids() -> None:
    config = tiny_config(use_fused_lm_heads=True)
    ours = build_parler(config, seed=1).state_dict()
    dac = tiny_dac().state_dict()
    upstream = keymap.to_upstream_state(ours, config, dac)
    assert keymap.FUSED_HEADS in upstream and keymap.TIED_T5 not in upstream
    assert upstream[keymap.FUSED_HEADS].shape == (9 * 1088, 32)
    assert any(k.startswith("audio_encoder.model.quantizer.quantizers.2.") for k in upstream)
    del upstream[keymap.DECODER_POSITIONS]  # recomputed on import
    back, dac_back = keymap.split_upstream_state(upstream, config)
    assert sorted(back) == sorted(ours) and sorted(dac_back) == sorted(dac)
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    assert all(torch.equal(dac_back[k], dac[k]) for k in dac)  # weight norm undone bit for bit
    with pytest.raises(keymap.UpstreamKeyError, match="decoder.model.decoder.layers.0.bogus.weight"):
        keymap.split_upstream_state({**upstream, "decoder.model.decoder.layers.0.bogus.weight": torch.zeros(1)}, config)
    with pytest.raises(keymap.UpstreamKeyError, match="audio_encoder.model.decoder.model.9.alpha"):
        keymap.split_upstream_state({**upstream, "audio_encoder.model.decoder.model.9.alpha": torch.zeros(1)}, config)


@pytest.mark.parametrize("style", ["parametrizations", "legacy"])
def test_dac_weight_norm_folds_like_torch(style: str) -> None:
    plain = tiny_dac()
    normed = copy.deepcopy(plain)
    normed.apply_weight_norm()  # transformers' own: torch parametrizations, original0 = g, original1 = v
    hf_normed = {"audio_encoder." + k: v for k, v in normed.state_dict().items()}  # v1.1-style layout
    assert any(k.endswith("parametrizations.weight.original0") for k in hf_normed)
    folded = keymap.dac_state_from_upstream(hf_normed)
    assert sorted(folded) == sorted(plain.state_dict())
    assert all(torch.allclose(folded[k], v, atol=1e-6) for k, v in plain.state_dict().items())
    descript = keymap.dac_state_to_upstream(plain.state_dict(), "descript", style)
    suffix = "weight_g" if style == "legacy" else "parametrizations.weight.original0"
    assert f"audio_encoder.model.decoder.model.1.block.1.{suffix}" in descript  # DecoderBlock 0's conv_t1
    assert "audio_encoder.model.encoder.block.1.block.0.block.1.bias" in descript  # its res_unit1.conv1
    back = keymap.dac_state_from_upstream(descript)
    assert all(torch.equal(back[k], v) for k, v in plain.state_dict().items())


@pytest.mark.skipif(not (FIXTURE / "audio_encoder_keys.json").exists(), reason="no upstream DAC key list")
def test_dac_descript_names_match_upstream_checkpoint() -> None:
    upstream_keys = json.loads((FIXTURE / "audio_encoder_keys.json").read_text())
    audio = json.loads((FIXTURE / "config.json").read_text())["audio_encoder"]
    with torch.device("meta"):
        dac = DacModel(keymap.dac_config_from_upstream(audio))
    exported = keymap.dac_state_to_upstream(dac.state_dict())
    assert {k: list(v.shape) for k, v in exported.items()} == {k: v["shape"] for k, v in upstream_keys.items()}
    meta_upstream = {k: torch.empty(v["shape"], device="meta") for k, v in upstream_keys.items()}
    assert sorted(keymap.dac_state_from_upstream(meta_upstream)) == sorted(dac.state_dict())


# --- sizes ---------------------------------------------------------------------------------------------------

DECODER_600M = dict(vocab_size=1088, max_position_embeddings=4096, num_hidden_layers=24, ffn_dim=4096,
                    num_attention_heads=16, layerdrop=0.0, activation_function="gelu", hidden_size=1024, dropout=0.1,
                    pad_token_id=1024, eos_token_id=1024, bos_token_id=1025, num_codebooks=9)
DAC_44K = dict(model_type="dac_on_the_hub", num_codebooks=9, codebook_size=1024, latent_dim=1024, sampling_rate=44100)


def t5(d_model: int, d_ff: int, heads: int, layers: int) -> dict[str, object]:
    return dict(model_type="t5", d_model=d_model, d_kv=64, d_ff=d_ff, num_heads=heads, num_layers=layers,
                vocab_size=32128, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def tensor_count(module: torch.nn.Module) -> int:
    """Parameters (shared ones once) + buffers: what a checkpoint stores."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())


@pytest.mark.parametrize("name,text_encoder,total,text", [
    ("mini-v0.1", t5(768, 2048, 12, 12), 647.0e6, 109.6e6),  # flan-t5-base (starting_point_0.01.json)
    ("mini-v1", t5(1024, 2816, 16, 24), 877.8e6, 341.2e6),  # flan-t5-large
])
def test_meta_build_sizes(name: str, text_encoder: dict[str, object], total: float, text: float) -> None:
    upstream = dict(vocab_size=32128, text_encoder=text_encoder, audio_encoder=DAC_44K, decoder=DECODER_600M)
    config = keymap.config_from_upstream(upstream)
    model = build_parler(config, device="meta")
    with torch.device("meta"):
        dac = DacModel(keymap.dac_config_from_upstream(DAC_44K))
    assert next(model.parameters()).is_meta
    assert tensor_count(dac) == pytest.approx(76.6e6, abs=0.05e6)
    assert tensor_count(model.text_encoder) == pytest.approx(text, abs=0.05e6)
    assert sum(p.numel() for p in model.decoder.parameters()) == pytest.approx(422.9e6, abs=0.05e6)  # sinusoids aside
    assert model.embed_prompts.weight.numel() == pytest.approx(32.9e6, abs=0.05e6)
    assert tensor_count(model) + tensor_count(dac) == pytest.approx(total, abs=0.1e6), name


# --- upstream's own outputs ----------------------------------------------------------------------------------


@pytest.mark.skipif(not (FIXTURE / "io.safetensors").exists(), reason="upstream fixture not generated")
def test_logits_and_loss_equal_upstream() -> None:
    from safetensors.torch import load_file

    config = keymap.config_from_upstream(json.loads((FIXTURE / "config.json").read_text()))
    ours, dac = keymap.split_upstream_state(keymap.read_upstream_state(FIXTURE), config)
    model = build_parler(config, seed=0)
    model.load_state_dict(ours)
    model.eval()
    io = load_file(FIXTURE / "io.safetensors")
    codes, lengths = io["audio_codes"], io["audio_codes_lengths"]
    labels = delay.collate_labels([delay.delay_labels(codes[b, :, : lengths[b]]) for b in range(len(lengths))])
    assert torch.equal(labels, io["labels"])
    inputs = delay.decoder_inputs(labels)
    assert torch.equal(inputs.transpose(1, 2), io["decoder_input_ids"])
    assert torch.equal(delay.loss_targets(labels) != delay.IGNORE_INDEX, io["loss_mask"])
    with torch.no_grad():
        cond = model.encode(io["input_ids"], io["attention_mask"], io["prompt_input_ids"], io["prompt_attention_mask"])
        logits = model.decode(inputs, cond)
    assert torch.allclose(cond.encoder_states, io["encoder_hidden_states"], atol=1e-5)
    assert logits.shape == io["logits"].shape
    assert (logits - io["logits"]).abs().max() < 1e-5
    sums, counts = delay.codebook_losses(logits, labels)
    assert torch.allclose(sums / counts, io["per_codebook_losses"], atol=1e-5)
    assert torch.allclose(delay.mean_of_means(sums, counts), io["loss"], atol=1e-5)
    assert torch.allclose(sums.sum() / 9, io["loss_sum"], rtol=1e-5)
