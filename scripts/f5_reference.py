"""Reference numbers from upstream f5-tts 1.1.22 for voxrelay's re-implementation (tests/unit/models/test_f5_dit.py).

Run it once in an environment of its own (f5-tts is never a voxrelay dependency):

    python3.11 -m venv /tmp/f5 && /tmp/f5/bin/pip install torch==2.13.0 f5-tts==1.1.22
    # the index's only torchaudio (2.11.1) is a CUDA build that cannot load here: its compiled ops are not needed
    # (the mel uses transforms.MelSpectrogram only), so move its .so files away for this script
    mkdir -p /tmp/f5-so && mv /tmp/f5/lib/python3.11/site-packages/torchaudio/lib/*.so /tmp/f5-so/
    /tmp/f5/bin/python scripts/f5_reference.py [OUT_DIR]       # default: tests/fixtures/f5

Writes OUT_DIR/reference.safetensors (weights under upstream `CFM.state_dict()` keys, i.e. the `model_state_dict`
layout "transformer....", plus tensors under "io.*") and reference.json (config, seeds, flags, scalars, checks).
Also writes upstream_ema.safetensors: the EMA's state_dict (ema_pytorch's, counters included) as f5-tts' released
checkpoints hold it (F5TTS_v1_Base/model_1250000.safetensors: "ema_model.transformer...."). And, into a temporary
folder, tiny_ckpt.pt (upstream Trainer.save_checkpoint layout) and
tiny_pretrained.safetensors (hub layout: "ema_model.transformer....") and checks that upstream's
infer.utils_infer.load_checkpoint reads both (recorded in reference.json's checks).

Everything runs on CPU in float32.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from f5_tts.model import CFM, DiT
from f5_tts.model.modules import MelSpec
from f5_tts.model.utils import lens_to_mask, list_str_to_idx, mask_from_frac_lengths
from safetensors.torch import save_file

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "f5"
OUT.mkdir(parents=True, exist_ok=True)
CKPTS = Path(tempfile.mkdtemp())  # upstream's checkpoint layouts: checked, not kept
torch.set_num_threads(1)  # CPU matmul reductions are thread-count dependent at the ~1e-7 level

# ---------------------------------------------------------------- tiny config
MODEL_SEED = 0
PERTURB_SEED = 1234
TINY = dict(
    dim=64, depth=2, heads=4, dim_head=16, ff_mult=2, text_dim=32, conv_layers=2,
    text_mask_padding=True, qk_norm=None, pe_attn_head=None, attn_backend="torch",
    attn_mask_enabled=False, checkpoint_activations=False,
)  # dropout left at DiT's default 0.1 (upstream YAMLs never set it)
VOCAB = [" ", "a", "b", "c", "d", "e", "h", "l", "o", "!"]  # line i of vocab.txt -> id i; " " must be id 0
vocab_char_map = {c: i for i, c in enumerate(VOCAB)}
MEL = dict(n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100, target_sample_rate=24000,
           mel_spec_type="vocos")

torch.manual_seed(MODEL_SEED)
model = CFM(
    transformer=DiT(**TINY, text_num_embeds=len(VOCAB), mel_dim=MEL["n_mel_channels"]),
    mel_spec_kwargs=MEL,
    vocab_char_map=vocab_char_map,
)
# upstream zero-inits adaLN / norm_out / proj_out (DiT.initialize_weights) and GRN gamma/beta, so a fresh
# model outputs exactly 0. Perturb every parameter (in named_parameters order) so outputs are non-trivial.
g = torch.Generator().manual_seed(PERTURB_SEED)
with torch.no_grad():
    for _, p in model.named_parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))

sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
io: dict[str, torch.Tensor] = {}
meta: dict = {
    "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    "tiny_config": TINY, "dropout": 0.1, "vocab": VOCAB, "mel": MEL,
    "model_seed": MODEL_SEED,
    "perturb": f"p += 0.05*randn(Generator().manual_seed({PERTURB_SEED})) per param in named_parameters order",
}
try:
    from importlib.metadata import version
    meta["versions"].update({k: version(k) for k in ["f5-tts", "x-transformers", "ema-pytorch", "torchdiffeq",
                                                      "vocos"]})
except Exception as e:  # noqa: BLE001
    meta["versions"]["error"] = repr(e)

# ---------------------------------------------------------------- fixed inputs
B, N, D = 2, 40, MEL["n_mel_channels"]
gi = torch.Generator().manual_seed(42)
lens = torch.tensor([40, 29])
mask = lens_to_mask(lens, length=N)  # [B, N] bool
x1 = torch.randn(B, N, D, generator=gi) * 2 - 5  # "log-mel-like"
x1 = x1.masked_fill(~mask[..., None], 0.0)  # collate_fn pads mel with 0
texts = ["hello abc!", "bad ech"]  # both shorter than their mel lengths
text_ids = list_str_to_idx([list(t) for t in texts], vocab_char_map)  # pad -1
io.update({"io.x1": x1, "io.lens": lens, "io.mask": mask, "io.text_ids": text_ids})
meta["texts"] = texts

# ---------------------------------------------------------------- (a) DiT vector field, eval mode
model.eval()
x_t = torch.randn(B, N, D, generator=gi)
cond = x1.clone()
cond[:, 10:25] = 0.0
time = torch.tensor([0.25, 0.8])
with torch.no_grad():
    tr = model.transformer
    vf = tr(x=x_t, cond=cond, text=text_ids, time=time, mask=mask)
    vf_drop_audio = tr(x=x_t, cond=cond, text=text_ids, time=time, mask=mask, drop_audio_cond=True)
    vf_uncond = tr(x=x_t, cond=cond, text=text_ids, time=time, mask=mask, drop_audio_cond=True, drop_text=True)
    vf_cfg = tr(x=x_t, cond=cond, text=text_ids, time=time, mask=mask, cfg_infer=True, cache=False)
    vf_nomask = tr(x=x_t[:1, :30], cond=cond[:1, :30], text=text_ids[:1], time=time[:1], mask=None)
    text_embed = tr.text_embed(text_ids, seq_len=mask.sum(1))  # per-sample lengths, as in training
    t_embed = tr.time_embed(time)
io.update({"io.vf_x": x_t, "io.vf_cond": cond, "io.vf_time": time, "io.vf": vf, "io.vf_drop_audio": vf_drop_audio,
           "io.vf_uncond": vf_uncond, "io.vf_cfg_infer": vf_cfg, "io.vf_nomask_b0_n30": vf_nomask,
           "io.text_embed": text_embed, "io.time_embed": t_embed})
meta["checks"] = {
    "cfg_infer_equals_cat(cond,uncond)": float((vf_cfg - torch.cat([vf, vf_uncond])).abs().max()),
    "vf_padding_rows_nonzero": bool(vf[1, 29:].abs().sum() > 0),
}

# ---------------------------------------------------------------- (b) CFM loss with every RNG draw recorded
def draws(seed: int):
    """Replicates CFM.forward's RNG calls (cfm.py:261-290) in order from the global generators."""
    torch.manual_seed(seed)
    random.seed(seed)
    frac = torch.zeros((B,)).float().uniform_(*model.frac_lengths_mask)  # 1: uniform_(0.7, 1.0)
    rand = torch.rand_like(frac)  # 2: span start (utils.py:73)
    x0 = torch.randn_like(x1)  # 3: noise
    t = torch.rand((B,), dtype=x1.dtype)  # 4: time
    r_audio, r_cond = random.random(), random.random()  # 5, 6: python `random`
    return frac, rand, x0, t, r_audio, r_cond


def explicit_loss(frac, rand, x0, t, drop_audio, drop_text, train: bool):
    lengths = (frac * lens).long()
    start = ((lens - lengths) * rand).long().clamp(min=0)
    seq = torch.arange(N)
    span = (seq[None] >= start[:, None]) & (seq[None] < (start + lengths)[:, None]) & mask
    tt = t[:, None, None]
    phi = (1 - tt) * x0 + tt * x1
    flow = x1 - x0
    c = torch.where(span[..., None], torch.zeros_like(x1), x1)
    model.train(train)
    pred = model.transformer(x=phi, cond=c, text=text_ids, time=t, drop_audio_cond=drop_audio,
                             drop_text=drop_text, mask=mask)
    loss = F.mse_loss(pred, flow, reduction="none")[span].mean()
    return loss, span, phi, flow, c, pred


cases = []
for seed in range(8):
    frac, rand, x0, t, ra, rc = draws(seed)
    drop_audio = ra < model.audio_drop_prob or rc < model.cond_drop_prob
    drop_text = rc < model.cond_drop_prob
    row = {"seed": seed, "frac_lengths": frac.tolist(), "span_rand": rand.tolist(), "time": t.tolist(),
           "random_audio": ra, "random_cond": rc, "drop_audio_cond": drop_audio, "drop_text": drop_text}
    for mode, train in (("eval", False), ("train", True)):
        model.train(train)
        torch.manual_seed(seed)
        random.seed(seed)
        loss_up, cond_up, pred_up = model(x1, text_ids, lens=lens)  # upstream CFM.forward
        row[f"loss_{mode}"] = loss_up.item()
        # explicit recomputation: same draws, then (train mode) dropout continues from the same RNG state
        frac2, rand2, x02, t2, _, _ = draws(seed)
        loss_ex, span, phi, flow, c, pred = explicit_loss(frac2, rand2, x02, t2, drop_audio, drop_text, train)
        row[f"loss_{mode}_explicit"] = loss_ex.item()
        row[f"max|pred-pred_explicit|_{mode}"] = float((pred - pred_up).detach().abs().max())
        torch.manual_seed(seed)
        up_span = mask_from_frac_lengths(lens, torch.zeros((B,)).float().uniform_(0.7, 1.0)) & mask
        row[f"span_equals_upstream_{mode}"] = bool(torch.equal(up_span, span))
        if seed == 0:
            io.update({f"io.loss_{mode}_pred": pred_up.detach(), f"io.loss_{mode}": loss_up.detach().reshape(1)})
            if mode == "eval":
                io.update({"io.loss_frac_lengths": frac, "io.loss_span_rand": rand, "io.loss_x0": x0,
                           "io.loss_time": t, "io.loss_span_mask": span, "io.loss_phi": phi, "io.loss_flow": flow,
                           "io.loss_cond": c})
                model.zero_grad(set_to_none=True)
                model.eval()
                torch.manual_seed(seed)
                random.seed(seed)
                loss_g, _, _ = model(x1, text_ids, lens=lens)
                loss_g.backward()
                grads = {f"io.grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters()
                         if p.grad is not None}
                io.update(grads)
                row["grad_global_norm_eval"] = float(torch.norm(torch.stack([v.norm() for v in grads.values()])))
                row["params_without_grad"] = [n for n, p in model.named_parameters() if p.grad is None]
                model.zero_grad(set_to_none=True)
    cases.append(row)
meta["loss_cases"] = cases
meta["loss_note"] = ("loss = mean of (pred-flow)^2 over all masked (frame, channel) elements of the batch; "
                     "eval = dropout off (only CFM's 4 torch draws + 2 python random() draws matter); "
                     "train = dropout(p=0.1) masks drawn after those, in block order attn.to_out[1], ff.ff[1]")

# ---------------------------------------------------------------- mel: upstream (torchaudio) vs plain torch
gw = torch.Generator().manual_seed(7)
n_samp = 12000
tt = torch.arange(n_samp) / 24000
wav = (0.3 * torch.sin(2 * math.pi * 220 * tt) + 0.05 * torch.randn(n_samp, generator=gw))[None]
mel_up = MelSpec(**MEL)(wav)  # [1, 100, frames]


def mel_plain(w: torch.Tensor) -> torch.Tensor:
    n_fft, hop, n_mels, sr = 1024, 256, 100, 24000
    spec = torch.stft(w, n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft), center=True,
                      pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()
    all_freqs = torch.linspace(0, sr // 2, n_fft // 2 + 1)
    hz2mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)  # noqa: E731  (HTK)
    m_pts = torch.linspace(hz2mel(0.0), hz2mel(float(sr // 2)), n_mels + 2)
    f_pts = 700.0 * (10.0 ** (m_pts / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.max(torch.zeros(1), torch.min(down, up))  # [513, 100], norm=None
    mel = torch.matmul(spec.transpose(-1, -2), fb).transpose(-1, -2)
    return mel.clamp(min=1e-5).log()


mel_pl = mel_plain(wav)
io.update({"io.mel_wav": wav, "io.mel_upstream": mel_up})
meta["mel_frames_for_12000_samples"] = mel_up.shape[-1]
meta["checks"]["max|mel_upstream-mel_plain_torch|"] = float((mel_up - mel_pl).abs().max())
meta["checks"]["mel_bit_exact"] = bool(torch.equal(mel_up, mel_pl))

# ---------------------------------------------------------------- sampling (CFM.sample), small
model.eval()
prompt = x1[:1, :12]
with torch.inference_mode():
    out, traj = model.sample(cond=prompt, text=[list("hello abc!")], duration=30, steps=4, cfg_strength=2.0,
                             sway_sampling_coef=-1.0, seed=123)
    out_nocfg, _ = model.sample(cond=prompt, text=[list("hello abc!")], duration=30, steps=4, cfg_strength=0.0,
                                sway_sampling_coef=None, seed=123, use_epss=False)
io.update({"io.sample_prompt": prompt, "io.sample_out": out.clone(), "io.sample_traj": traj.clone(),
           "io.sample_out_nocfg_nosway": out_nocfg.clone()})
steps4 = torch.linspace(0, 1, 5)
meta["sample"] = {"duration": 30, "steps": 4, "cfg_strength": 2.0, "sway": -1.0, "seed": 123, "method": "euler",
                  "t_grid": (steps4 + -1.0 * (torch.cos(torch.pi / 2 * steps4) - 1 + steps4)).tolist(),
                  "noise": "torch.manual_seed(seed); torch.randn(duration, 100) per sample (cfm.py:197-200)"}

# ---------------------------------------------------------------- write
io = {k: v.detach().clone().contiguous() for k, v in io.items()}
save_file({**sd, **io}, str(OUT / "reference.safetensors"))
meta["weight_keys"] = list(sd.keys())
meta["io_keys"] = {k: list(v.shape) for k, v in io.items() if not k.startswith("io.grad.")}
(OUT / "reference.json").write_text(json.dumps(meta, indent=1))

# ---------------------------------------------------------------- upstream checkpoint layouts (tiny)
from ema_pytorch import EMA  # noqa: E402

# gotcha: after CFM.sample() the DiT keeps a threading.local in __dict__["_cache_local"] (dit.py:239-244) and
# copy.deepcopy (EMA init) fails with "cannot pickle '_thread._local'". Upstream builds EMA before sampling.
model.transformer.__dict__.pop("_cache_local", None)
ema = EMA(model, include_online_model=False)  # trainer.py:107 (defaults: beta .9999, after 100, every 10)
ema.update()  # first call copies weights and sets initted
opt = torch.optim.AdamW(model.parameters(), lr=7.5e-5)
sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-8, end_factor=1.0, total_iters=10)
ckpt = dict(model_state_dict=model.state_dict(), optimizer_state_dict=opt.state_dict(),
            ema_model_state_dict=ema.state_dict(), scheduler_state_dict=sched.state_dict(), update=0)
torch.save(ckpt, CKPTS / "tiny_ckpt.pt")  # trainer.py:153-163
save_file({k: v.contiguous() for k, v in ema.state_dict().items() if k not in ("initted", "step")},
          str(CKPTS / "tiny_pretrained.safetensors"))
# the released checkpoints' layout as ema_pytorch writes it (what model.init_from reads), kept as a fixture
save_file({k: v.contiguous() for k, v in ema.state_dict().items()}, str(OUT / "upstream_ema.safetensors"))
try:
    from f5_tts.infer.utils_infer import load_checkpoint

    for f in ("tiny_ckpt.pt", "tiny_pretrained.safetensors"):
        m2 = CFM(transformer=DiT(**TINY, text_num_embeds=len(VOCAB), mel_dim=100), mel_spec_kwargs=MEL,
                 vocab_char_map=vocab_char_map)
        load_checkpoint(m2, str(CKPTS / f), "cpu", dtype=torch.float32, use_ema=True)
        same = all(torch.equal(m2.state_dict()[k], sd[k]) for k in sd)
        meta["checks"][f"upstream_load_checkpoint({f})_matches"] = same
except Exception as e:  # noqa: BLE001
    meta["checks"]["upstream_load_checkpoint_error"] = repr(e)
meta["ema_state_dict_first_keys"] = list(ema.state_dict().keys())[:4]
(OUT / "reference.json").write_text(json.dumps(meta, indent=1))
print(json.dumps({k: meta[k] for k in ("checks", "loss_cases")}, indent=1))
