"""VibeVoice's precomputed latents (``codec.type: vibevoice_latents``): prepare stores the frozen encoders' outputs
of a given checkpoint instead of the audio; training on them equals training on the audio bit for bit (the
encoders never run), voice prompts (a row's own and other clips of a voice) come from them, data made by other
encoders is refused, and the shards keep the features as float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.vibevoice import save_tiny_vibevoice
from tests.helpers.vibevoice_data import prepare_for_vibevoice, seed_003_corpus
from voxrelay.codecs.base import CodecError
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.codecs.registry import codec_from_description
from voxrelay.data import shards as sh
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import DataNeeds, DataSpec, pop_counts
from voxrelay.models.hf import ModelLoadError
from voxrelay.models.registry import build_model
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig
from voxrelay.models.vibevoice.latent_codec import VibeVoiceLatentCodec

PCM = PcmCodec(24000)


def _wav(i: int, seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.3 * np.sin(2 * np.pi * (110 + 37 * i) * t) * (1 + 0.5 * np.sin(2 * np.pi * (2 + i) * t))).astype(
        np.float32)


# row 0 names two voices (prompts: rows 1 and 2), row 3 brings its own two prompts, rows 1 and 2 are one voice each
TEXTS = [("[SPEAKER_A] Hello there.\n[SPEAKER_B] Hi, how are you?", "a,b", 2.0),
         ("[SPEAKER_A] One voice.", "a", 1.0), ("[SPEAKER_A] The other voice.", "b", 0.9),
         ("[SPEAKER_A] With my own prompts.\n[SPEAKER_B] Yes.", None, 1.3)]


def _rows(codec) -> list[EncodedUtterance]:
    rows = []
    for i, (text, speaker, seconds) in enumerate(TEXTS):
        prompts = tuple(sh.stored_array(codec.encode(_wav(7 + j, 0.6 + 0.2 * j)), codec) for j in range(2)) \
            if i == 3 else ()
        rows.append(EncodedUtterance(f"r{i}", text, speaker, None, seconds,
                                     sh.stored_array(codec.encode(_wav(i, seconds)), codec), voice_prompts=prompts))
    return rows


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("vvl")
    return save_tiny_vibevoice(base / "tiny"), save_tiny_vibevoice(base / "other", seed=1)


@pytest.fixture(scope="module")
def latent_codec(checkpoints):
    return VibeVoiceLatentCodec.load(str(checkpoints[0]))


def _model(init_from, data: DataSpec, rows, **settings):
    cfg = VibeVoiceFamilyConfig(init_from=str(init_from), max_length=1024, voice_prompt_drop_rate=0.0, dropout=0.1,
                                **settings)
    model = build_model(cfg, data, seed=0)
    model.use_corpus(rows)
    return model


def _spec(codec) -> DataSpec:
    return DataSpec(codec.num_codebooks, codec.codebook_size, [], codec.frame_rate, codec.sample_rate,
                    codec=codec.describe())


def _train(model, rows, steps: int = 3):
    """(losses, encoder calls, trained weights) of ``steps`` steps over ``rows``; dropout 0.1 and the σ-VAE and
    diffusion noise from the family generator."""
    calls: list[int] = []
    for part in (model.net.model.audio_tower.encoder, model.net.model.semantic_tokenizer_encoder):
        part.register_forward_hook(lambda module, args, out: calls.append(1))
    torch.manual_seed(0)
    params = [p for p in model.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for _ in range(steps):
        batch = model.collate([model.example(r) for r in rows])
        pop_counts(batch)
        loss = sum(t.sum / t.count for t in model.loss(model.module, batch).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, len(calls), [p.detach().clone() for p in params]


def test_training_on_stored_latents_equals_training_on_the_audio_and_never_runs_the_encoders(checkpoints,
                                                                                            latent_codec):
    ckpt = checkpoints[0]
    audio_rows, latent_rows = _rows(PCM), _rows(latent_codec)
    assert latent_rows[0].codes.dtype == np.float32 and latent_rows[0].codes.shape[0] == 64 + 32
    assert latent_rows[3].voice_prompts[1].shape == (96, 6)  # 0.8 s of prompt: 6 latents
    audio = _model(ckpt, DataSpec(1, 65536, [], 24000.0, 24000), audio_rows, feature_cache_gb=0.0)
    stored = _model(ckpt, _spec(latent_codec), latent_rows, feature_cache_gb=0.0)
    assert stored.maker.features and not audio.maker.features
    for a, b in zip(audio_rows, latent_rows, strict=True):
        assert audio.length(a) == stored.length(b)
        ea, eb = audio.example(a), stored.example(b)
        assert np.array_equal(ea["input_ids"], eb["input_ids"]) and len(ea["clips"]) == len(eb["clips"])
    assert len(stored.example(latent_rows[0])["clips"]) == 3 and len(stored.example(latent_rows[3])["clips"]) == 3
    losses_a, calls_a, weights_a = _train(audio, audio_rows)
    losses_b, calls_b, weights_b = _train(stored, latent_rows)
    assert calls_a > 0 and calls_b == 0
    assert losses_a == losses_b and len(set(losses_b)) == 3
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_latents_of_other_encoders_are_refused_and_a_dtype_change_is_not(checkpoints, latent_codec, dtype):
    rows = _rows(latent_codec)[:3]
    with pytest.raises(ModelLoadError, match=r"do not fit .*encoders have other weights.*codec.path=.*other"):
        _model(checkpoints[1], _spec(latent_codec), rows)
    moved = DataSpec(96, 0, [], 7.5, 24000, codec=dict(latent_codec.describe(), hop_length=1600))
    with pytest.raises(ModelLoadError, match="per 1600 samples, the model's 64 \\+ 32 per 3200"):
        _model(checkpoints[0], moved, rows)
    low = _model(checkpoints[0], _spec(latent_codec), rows, weights_dtype=dtype)
    assert low.maker.features  # the same encoders in 16 bits: the sketch moves by their rounding only
    batch = low.collate([low.example(rows[0])])
    pop_counts(batch)
    embeds, lat, target = low.module.audio_embeddings(batch["audio"], batch["audio_len"], batch["audio_key"],
                                                      batch["audio_is_target"])
    assert lat.dtype == getattr(torch, dtype) and int(target.sum()) == latent_codec.encode(_wav(0, 2.0)).shape[1]


def test_the_codec_rebuilt_from_the_index_loads_its_weights_only_to_decode_and_checks_them(checkpoints,
                                                                                         latent_codec, tmp_path):
    desc = latent_codec.describe()
    assert desc["type"] == "vibevoice_latents" and desc["codebook_size"] == 0 and desc["hop_length"] == 3200
    moved = dict(desc, path=str(tmp_path / "gone"))
    rebuilt = codec_from_description(moved)  # no weights read: training never encodes
    assert rebuilt.describe() == moved and rebuilt.num_codebooks == 96 and rebuilt.frame_rate == 7.5
    with pytest.raises(CodecError, match="no such folder"):
        rebuilt.decode(latent_codec.encode(_wav(0, 1.0)))
    stored = latent_codec.encode(_wav(0, 1.0))
    wav = codec_from_description(desc).decode(stored)
    tower = latent_codec.parts["acoustic"]
    expect = tower.decode(torch.from_numpy(stored[:64].T.copy())[None]).audio.reshape(-1).detach().numpy()
    assert wav.shape == (8 * 3200,) and np.array_equal(wav, expect)
    with pytest.raises(CodecError, match="no longer holds the encoders.*other weights"):
        codec_from_description(dict(desc, path=str(checkpoints[1]))).decode(stored)


def test_shards_keep_features_as_float32_and_codes_as_before(latent_codec):
    features = _rows(latent_codec)
    back = sh.decode_table(sh.encode_table(features), 96)
    assert back[3].codes.dtype == np.float32 and np.array_equal(back[3].codes, features[3].codes)
    assert all(np.array_equal(a, b) for a, b in zip(back[3].voice_prompts, features[3].voice_prompts, strict=True))
    codes = _rows(PCM)
    assert sh.decode_table(sh.encode_table(codes), 1)[0].codes.dtype == np.int16
    with pytest.raises(ValueError, match="mix"):
        sh.encode_table([features[0], codes[1]])


def test_families_name_the_fix_for_data_they_cannot_learn_from(latent_codec):
    desc = latent_codec.describe()
    vibevoice = VibeVoiceFamilyConfig().data_needs()
    assert vibevoice.refusal("vibevoice", desc) is None
    assert "codec.type=vibevoice_latents" in vibevoice.refusal("vibevoice", {"type": "snac", "sample_rate": 24000})
    assert "features, not codes" in DataNeeds().refusal("codec_lm", desc)


def test_prepare_stores_latents_with_the_rows_own_voice_prompts_and_the_eval_reference(checkpoints, tmp_path,
                                                                                       monkeypatch):
    folder = seed_003_corpus(tmp_path, {"d001": "audio/d002.wav;audio/d002.wav",
                                        "d002": "audio/d001.wav;audio/d001.wav"})
    _, index, rows = prepare_for_vibevoice(
        tmp_path, monkeypatch, f"{{type: folder, path: {folder}}}", "data.eval_size=1",
        "codec.type=vibevoice_latents", f"codec.path={checkpoints[0]}")
    assert index["codec"]["type"] == "vibevoice_latents"
    assert len(index["identity"]["params"]["codec.encoders_sketch"]) == 9  # the data's identity names the encoders
    prompted = next(iter(rows.values()))  # one row trains, the other is held out
    assert prompted.codes.dtype == np.float32 and [p.shape[0] for p in prompted.voice_prompts] == [96, 96]
    assert prompted.codes.shape[1] == -(-round(prompted.duration * 24000) // 3200)
    from voxrelay.data.loader import PreparedDataset

    held_out = PreparedDataset.open(str(tmp_path / "root/prepared/demo"), "eval", index).rows
    assert held_out and held_out[0].ref_audio is not None  # MCD at eval scores against the recording


def test_plan_sizes_examples_of_stored_latents_as_those_of_the_audio(checkpoints, tmp_path, monkeypatch):
    """`voxrelay plan` reads example lengths from the prepared rows: latents (a row's frames are latents) and audio
    (its frames are samples) of the same clips give the same token counts."""
    from voxrelay.config import load_config
    from voxrelay.plan.model import lengths, model_facts, read_index

    folder = seed_003_corpus(tmp_path)
    sizes = {}
    for name, extra in (("audio", ()), ("latents", ("codec.type=vibevoice_latents", f"codec.path={checkpoints[0]}"))):
        overrides = (f"data.name={name}", f"model.init_from={checkpoints[0]}", *extra)
        prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {folder}}}", *overrides)
        cfg = load_config(None, [f"root={tmp_path / 'root'}", f"data.sources=[{{type: folder, path: {folder}}}]",
                                 "data.eval_size=0", "codec.type=pcm", "codec.sample_rate=24000",
                                 "model.family=vibevoice", "model.max_length=4096", *overrides])
        index = read_index(cfg)
        sizes[name] = lengths(cfg, model_facts(cfg, index)[1], index, None).max_len
    assert sizes["latents"] == sizes["audio"] > 40, sizes


def test_prepare_advises_latents_past_the_measured_threshold(tmp_path, monkeypatch, caplog):
    from voxrelay.models.vibevoice import config as vv

    assert VibeVoiceFamilyConfig().storage_advice({"hours": 5.0, "codec": {"type": "pcm"}}) is None  # seed 003
    advice = VibeVoiceFamilyConfig(feature_cache_gb=1.0).storage_advice({"hours": 120.0, "codec": {"type": "pcm"}})
    assert "codec.type=vibevoice_latents codec.path=vibevoice/VibeVoice-1.5B-hf" in advice
    assert "20 min on an H200" in advice and "holds 52 h" in advice and "2.5 GB instead of about 16.6 GB" in advice
    assert VibeVoiceFamilyConfig().storage_advice({"hours": 120.0, "codec": {"type": "vibevoice_latents"}}) is None
    monkeypatch.setattr(vv, "LATENTS_ADVISED_HOURS", 0.0001)  # the fixture's seconds of audio pass it
    folder = seed_003_corpus(tmp_path)
    prepare_for_vibevoice(tmp_path, monkeypatch, f"{{type: folder, path: {folder}}}")
    assert "store their outputs once: prepare with codec.type=vibevoice_latents" in caplog.text


def _speaks_audio(model) -> None:
    """The random LM made to emit audio tokens (greedy generation would end at once): its logits pushed there."""
    bump = torch.zeros(model.net.config.text_config.vocab_size)
    bump[model.maker.ids["pad"]] = 1e4
    model.net.lm_head.register_forward_hook(lambda module, args, out: out + bump.to(out))


def test_synthesis_takes_stored_prompts_as_training_did_without_a_round_trip(checkpoints, latent_codec):
    """A voice prompt given as stored latents (eval's held-out rows, corpus voices) conditions synthesis exactly as
    the same clip given as audio (the stored means are what the encoder gives it): the same speech, bit for bit;
    its reference voice for similarity is the σ-VAE's decoding."""
    from voxrelay.models.base import Request

    model = _model(checkpoints[0], _spec(latent_codec), _rows(latent_codec)[:3])
    _speaks_audio(model)
    pcm = np.round(np.clip(_wav(5, 1.1), -1, 1) * 32767)
    stored = sh.stored_array(latent_codec.encode(_wav(5, 1.1)), latent_codec)
    assert model.stored_prompt(latent_codec, stored).shape == (96, 9)  # as stored: nothing decoded
    text = "Speaker 0: Hello there."
    as_audio = model.speak(Request(text, voice_prompts=((pcm / 32767).astype(np.float32),)), latent_codec,
                           max_frames=3, seed=1)
    as_latents = model.speak(Request(text, voice_prompts=(stored,)), latent_codec, max_frames=3, seed=1)
    assert as_audio.frames == as_latents.frames == 3 and np.array_equal(as_audio.wav, as_latents.wav)
    elsewhere = sh.stored_array(latent_codec.encode(_wav(9, 1.1)), latent_codec)
    other = model.speak(Request(text, voice_prompts=(elsewhere,)), latent_codec, max_frames=3, seed=1)
    assert not np.array_equal(other.wav, as_latents.wav)  # the prompt does condition it
    voice = model.voice_references(Request(text, voice_prompts=(stored,)))
    assert len(voice) == 1 and voice[0].shape == (9 * 3200,)


def test_stored_prompts_speak_and_decode_under_fsdp(checkpoints, latent_codec):
    """Under train.strategy=fsdp (a world of one here) the root's parameters are sharded between steps: synthesis
    with stored prompts and their decoding for similarity run through the root's registered methods."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from voxrelay.models.base import Request
    from voxrelay.models.registry import get_family
    from voxrelay.train.strategies import apply_fsdp

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rows = _rows(latent_codec)[:3]
        model = _model(checkpoints[0], _spec(latent_codec), rows)
        _speaks_audio(model)
        apply_fsdp(model.module, model.fsdp_layer_classes(), "full_shard", "no", False, init_device_mesh("cpu", (1,)),
                   get_family("vibevoice").fsdp_forward_methods)
        batch = model.collate([model.example(rows[0])])
        pop_counts(batch)
        sum(t.sum / t.count for t in model.loss(model.module, batch).values()).backward()  # resharded after
        request = Request("Speaker 0: Hello.", voice_prompts=(rows[1].codes,))
        assert model.speak(request, latent_codec, max_frames=2).frames == 2
        assert model.voice_references(request)[0].size == rows[1].codes.shape[1] * 3200
    finally:
        if own:
            dist.destroy_process_group()
