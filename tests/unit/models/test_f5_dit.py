"""voxrelay's F5-TTS pieces against upstream f5-tts 1.1.22's own outputs, recorded by ``scripts/f5_reference.py`` in
an isolated environment (tests/fixtures/f5/: a tiny DiT's weights under upstream's ``CFM.state_dict()`` keys, its
inputs and outputs): the vector field in every conditioning mode, the text and time embeddings, the training loss
with upstream's draws and its gradients, the mel spectrogram, and the sway-sampled ODE with guidance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from voxrelay.models.f5 import flow
from voxrelay.models.f5.dit import DiT, DiTSizes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "f5"
ATOL = 1e-5


@pytest.fixture(scope="module")
def upstream():
    ref = load_file(str(FIXTURES / "reference.safetensors"))
    meta = json.loads((FIXTURES / "reference.json").read_text())
    c = meta["tiny_config"]
    dit = DiT(DiTSizes(dim=c["dim"], depth=c["depth"], heads=c["heads"], dim_head=c["dim_head"], ff_mult=c["ff_mult"],
                       text_dim=c["text_dim"], conv_layers=c["conv_layers"], text_num_embeds=len(meta["vocab"])))
    dit.load_state_dict({k.removeprefix("transformer."): v for k, v in ref.items() if k.startswith("transformer.")})
    io = {k.removeprefix("io."): v for k, v in ref.items() if k.startswith("io.")}
    return dit.eval(), io, meta


def test_upstream_weights_load_by_their_own_names(upstream):
    dit, io, meta = upstream
    assert sorted(k.removeprefix("transformer.") for k in meta["weight_keys"]) == sorted(dit.state_dict())


@pytest.mark.parametrize("mode", ["vf", "vf_drop_audio", "vf_uncond", "vf_cfg_infer"])
def test_the_vector_field_is_upstreams_in_every_conditioning_mode(upstream, mode):
    dit, io, _ = upstream
    flags = {"vf": {}, "vf_drop_audio": {"drop_audio_cond": True},
             "vf_uncond": {"drop_audio_cond": True, "drop_text": True}, "vf_cfg_infer": {"cfg_infer": True}}[mode]
    with torch.no_grad():
        out = dit(x=io["vf_x"], cond=io["vf_cond"], text=io["text_ids"], time=io["vf_time"], mask=io["mask"], **flags)
        unmasked = dit(x=io["vf_x"][:1, :30], cond=io["vf_cond"][:1, :30], text=io["text_ids"][:1],
                       time=io["vf_time"][:1])
        text = dit.text_embed(io["text_ids"], io["mask"].sum(1))
    torch.testing.assert_close(out, io[mode], atol=ATOL, rtol=0)
    torch.testing.assert_close(unmasked, io["vf_nomask_b0_n30"], atol=ATOL, rtol=0)
    torch.testing.assert_close(text, io["text_embed"], atol=ATOL, rtol=0)
    torch.testing.assert_close(dit.time_embed(io["vf_time"]).detach(), io["time_embed"], atol=ATOL, rtol=0)


def test_the_loss_and_its_gradients_are_upstreams_given_its_draws(upstream):
    dit, io, meta = upstream
    case = meta["loss_cases"][0]
    draws = flow.Draws(io["loss_frac_lengths"], io["loss_span_rand"], io["loss_x0"], io["loss_time"],
                       case["drop_audio_cond"], case["drop_text"])
    assert torch.equal(flow.span_mask(io["lens"], draws.frac, draws.start, io["x1"].shape[1]), io["loss_span_mask"])
    dit.zero_grad(set_to_none=True)
    total, count = flow.loss_terms(dit, io["x1"], io["text_ids"], io["lens"], draws)
    (total / count).backward()
    assert float(total / count) == pytest.approx(float(io["loss_eval"]), rel=1e-6)
    grads = {name: p.grad for name, p in dit.named_parameters() if p.grad is not None}
    upstream_grads = {k.removeprefix("grad.transformer."): v for k, v in io.items() if k.startswith("grad.")}
    assert grads.keys() == upstream_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, upstream_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    dit.zero_grad(set_to_none=True)


def test_draws_come_from_the_generator_in_upstreams_order_and_make_its_dropouts():
    g = torch.Generator().manual_seed(0)
    d = flow.draw(g, 2, 40, 100)
    g2 = torch.Generator().manual_seed(0)
    assert torch.equal(torch.empty(2).uniform_(0.7, 1.0, generator=g2), d.frac)
    assert torch.equal(torch.rand(2, generator=g2), d.start) and d.noise.shape == (2, 40, 100)
    flips = [flow.draw(g, 1, 4, 2) for _ in range(400)]
    both = sum(f.drop_text for f in flips) / 400
    audio = sum(f.drop_audio for f in flips) / 400
    assert all(f.drop_audio for f in flips if f.drop_text)  # dropping the text drops the audio too
    assert 0.12 < both < 0.28 and 0.36 < audio < 0.52  # 0.2, and 0.3 + 0.7 x 0.2 = 0.44


def test_the_mel_spectrogram_is_upstreams_bit_for_bit(upstream):
    _, io, _ = upstream
    assert torch.equal(flow.log_mel(io["mel_wav"]), io["mel_upstream"])


def test_sway_sampling_with_guidance_is_upstreams(upstream):
    dit, io, meta = upstream
    s = meta["sample"]
    text = io["text_ids"][:1]
    out, path = flow.sample(dit, io["sample_prompt"], text, s["duration"], steps=s["steps"], cfg=s["cfg_strength"],
                            sway=s["sway"], seed=s["seed"])
    assert torch.allclose(flow.time_grid(4, -1.0), torch.tensor(s["t_grid"]), atol=1e-7)
    torch.testing.assert_close(path, io["sample_traj"], atol=ATOL, rtol=0)
    torch.testing.assert_close(out, io["sample_out"], atol=ATOL, rtol=0)
    plain, _ = flow.sample(dit, io["sample_prompt"], text, s["duration"], steps=4, cfg=0.0, sway=None, seed=s["seed"])
    torch.testing.assert_close(plain, io["sample_out_nocfg_nosway"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_vocos_decodes_as_upstream_from_a_folder_laid_out_as_the_hubs(tmp_path, weights):
    import shutil

    from safetensors.torch import save_file

    from voxrelay.models.f5.vocos import Vocos

    ref = load_file(str(FIXTURES / "vocos_reference.safetensors"))
    state = {k: v for k, v in ref.items() if not k.startswith("io.")}
    shutil.copy(FIXTURES / "vocos_config.yaml", tmp_path / "config.yaml")
    if weights == "model.safetensors":
        save_file(state, str(tmp_path / weights))
    else:
        torch.save(state, tmp_path / weights)  # the hub's format for charactr/vocos-mel-24khz
    audio = Vocos.from_folder(tmp_path).decode(ref["io.mel"])
    assert audio.shape == ref["io.audio"].shape == (1, 256 * (ref["io.mel"].shape[-1] - 1))
    torch.testing.assert_close(audio, ref["io.audio"], atol=1e-5, rtol=0)


def test_a_vocoder_folder_without_weights_is_refused_naming_the_fix(tmp_path):
    import shutil

    from voxrelay.models.f5.vocos import VocoderError, Vocos

    shutil.copy(FIXTURES / "vocos_config.yaml", tmp_path / "config.yaml")
    with pytest.raises(VocoderError, match="holds no model.safetensors or pytorch_model.bin; point it at"):
        Vocos.from_folder(tmp_path)
    with pytest.raises(VocoderError, match="no readable config.yaml"):
        Vocos.from_folder(tmp_path / "missing")


def test_text_tokens_and_ids_are_upstreams_with_its_pinyin_vocab_and_as_bytes():
    from voxrelay.models.f5.text import Vocab, tokens

    ref = json.loads((FIXTURES / "text_reference.json").read_text())
    vocab = Vocab.read(FIXTURES / "vocab.txt")
    assert len(vocab) == ref["vocab_size"] == 2545
    for case in ref["cases"]:
        assert tokens(case["text"]) == case["tokens"], case["text"]
        assert vocab.encode(case["text"]) == case["ids"], case["text"]
        assert Vocab.utf8().encode(case["text"]) == case["bytes"], case["text"]
    assert vocab.unknown("naïve ☺") == ["☺"]


def test_a_vocab_file_whose_first_token_is_not_a_space_is_refused(tmp_path):
    from voxrelay.models.f5.text import TextError, Vocab

    (tmp_path / "vocab.txt").write_text("a\n \nb\n")
    with pytest.raises(TextError, match="first line must be a single space"):
        Vocab.read(tmp_path / "vocab.txt")
    with pytest.raises(TextError, match="cannot be read"):
        Vocab.read(tmp_path / "missing.txt")


def test_the_ema_follows_upstreams_schedule_update_by_update():
    from voxrelay.models.f5.ema import WeightsEma

    ref = json.loads((FIXTURES / "ema_reference.json").read_text())["ema"]
    model = torch.nn.Linear(1, 1, bias=False)
    ema = WeightsEma(model, enabled=True)
    got = []
    for step in range(len(ref)):
        with torch.no_grad():
            model.weight.fill_(float(step + 1))
        ema.update()
        got.append(float(ema.weights["weight"]))
    assert got == pytest.approx(ref, rel=1e-6)
    restored = WeightsEma(model, enabled=True)
    restored.load(ema.state())  # a resumed run goes on from the same weights and step
    assert restored.step == len(ref) and torch.equal(restored.weights["weight"], ema.weights["weight"])
    with ema.swapped_in():
        assert float(model.weight) == got[-1]
    assert float(model.weight) == len(ref)


@pytest.mark.parametrize("dims", [(288, 2, 3, 96, 3), (640, 1, 10, 320, 2)], ids=lambda d: f"dim{d[0]}")
def test_plan_prices_the_dit_within_5_percent_of_what_autograd_saves(dims):
    """Shapes the formula's coefficients were not counted on: a whole step's saved bytes (400 frames, fp32)."""
    from tests.unit.test_plan import saved_bytes
    from voxrelay.models.f5.config import F5Config
    from voxrelay.models.f5.loading import build
    from voxrelay.plan.formulas import activation_bytes

    dim, depth, heads, text_dim, convs = dims
    model = build(F5Config(dropout=0.0, dim=dim, depth=depth, heads=heads, text_dim=text_dim, conv_layers=convs),
                  None, 0)
    mel, text, lens = torch.randn(2, 200, 100), torch.randint(0, 255, (2, 40)), torch.tensor([200, 170])
    params = {p.untyped_storage().data_ptr() for p in model.module.parameters()}
    seen = saved_bytes(lambda: model.module(mel=mel, text=text, lens=lens))
    measured = sum(n for ptr, n in seen.items() if ptr not in params)
    predicted = activation_bytes(model.plan_shape(), 400, "fp32", False)
    assert predicted == pytest.approx(measured, rel=0.05)


def test_a_vocoder_hub_id_that_cannot_be_fetched_names_the_download(monkeypatch):
    from voxrelay.models.f5.vocos import VocoderError, Vocos

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the hub client fails at once
    with pytest.raises(VocoderError, match="huggingface-cli download charactr/vocos-mel-24khz --local-dir vocos"):
        Vocos.load("charactr/vocos-mel-24khz")
    with pytest.raises(VocoderError, match="no readable config.yaml"):
        Vocos.load("./no-such-vocos")


def test_a_checkpoints_architecture_is_read_from_its_tensors_whatever_heads_x_64_is(tmp_path):
    from voxrelay.models.f5.config import F5Config
    from voxrelay.models.f5.loading import build, load

    model = build(F5Config(dim=64, depth=2, heads=2, text_dim=32, conv_layers=1), None, 0)  # 2 x 64 = 128 != 64
    model.save_pretrained(tmp_path / "export")
    again = build(F5Config(init_from=str(tmp_path / "export")), None, 1)
    assert again.dit.sizes == model.dit.sizes
    for name, value in model.module.state_dict().items():
        assert torch.equal(again.module.state_dict()[name], value), name
    assert load(tmp_path / "export").dit.sizes == model.dit.sizes


def test_a_longer_vocab_grows_the_checkpoints_text_embedding_keeping_its_rows(tmp_path):
    from voxrelay.models.f5.config import F5Config
    from voxrelay.models.f5.loading import build

    meta = json.loads((FIXTURES / "reference.json").read_text())
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in [*meta["vocab"], "ł", "ź"]))  # a new language's
    ref = load_file(str(FIXTURES / "upstream_ema.safetensors"))["ema_model.transformer.text_embed.text_embed.weight"]
    cfg = F5Config(init_from=str(FIXTURES / "upstream_ema.safetensors"), vocab=str(tmp_path / "vocab.txt"))
    model = build(cfg, None, 0)
    grown = model.dit.text_embed.text_embed.weight.detach()
    assert grown.shape == (len(meta["vocab"]) + 3, ref.shape[1]) and torch.equal(grown[: ref.shape[0]], ref)
    assert model.new_token_rows() == [11, 12] and grown[11:].abs().sum() > 0
    assert "append them to" in cfg.text_coverage_fix(["ł", "ź"]) and "ł ź" in cfg.text_coverage_fix(["ł", "ź"])
    assert [t for t, _, _ in cfg.text_coverage(["hello ł!", "ż"])] == ["ż"]


def test_held_out_losses_draw_the_same_in_eval_mode_so_text_gain_compares_texts_alone():
    from voxrelay.models.f5.config import F5Config
    from voxrelay.models.f5.loading import build

    model = build(F5Config(dim=64, depth=1, heads=1, text_dim=32, conv_layers=1, dropout=0.0), None, 0)
    mel, lens = torch.randn(2, 50, 100), torch.tensor([50, 40])
    text, other = torch.randint(0, 255, (2, 12)), torch.randint(0, 255, (2, 12))
    model.module.eval()
    with torch.no_grad():
        first, again = model.module(mel=mel, text=text, lens=lens), model.module(mel=mel, text=text, lens=lens)
        swapped = model.module(mel=mel, text=other, lens=lens)
    assert torch.equal(first, again)  # the same draws: a fresh model's field is 0, so texts change nothing
    assert torch.equal(first, swapped)
    model.module.train()
    assert not torch.equal(model.module(mel=mel, text=text, lens=lens).detach(), first)  # training draws move on
