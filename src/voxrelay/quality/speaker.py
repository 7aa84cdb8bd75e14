"""Speaker embeddings for the "speaker similarity" eval metric: cosine(embed(generated), embed(reference)).

A re-implementation of Resemblyzer's ``VoiceEncoder`` (a GE2E d-vector model: 3-layer LSTM over
40 mel bands, 256 hidden, Linear 256->256, ReLU, L2 norm) that loads the ``pretrained.pt`` shipped
inside the ``resemblyzer`` wheel but never imports that package: its ``__init__`` pulls librosa
and webrtcvad, which break with modern setuptools. Weight-compatible, and the same front end:

* resample to 16 kHz (soxr HQ, what ``librosa.resample`` uses by default);
* raise the volume to -30 dBFS (never lower it), as ``normalize_volume(..., increase_only=True)``;
* shorten long silences. Resemblyzer runs webrtcvad (mode 3) on 30 ms windows; here a window is
  "voiced" when its energy is within 40 dB of the loudest window, 6 dB above the noise floor (10th
  percentile of the windows) and above -60 dBFS. The smoothing (moving average of 8 windows) and
  dilation (6 windows) that follow are Resemblyzer's. Measured on eSpeak clips with 1-1.5 s pauses,
  zero or hiss padding: cosine to Resemblyzer's embedding >= 0.997 (no trimming at all: 0.95-0.97);
* power mel spectrogram as ``librosa.feature.melspectrogram`` (0.11): n_fft=400 (25 ms),
  hop=160 (10 ms), periodic Hann, centred frames with zero padding, Slaney mel scale and norm;
* partials of 160 frames (1.6 s) at 1.3 partials/s, the last one kept when it covers >= 75 %,
  embedded in one batch, averaged and L2-normalised (``embed_utterance``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voxrelay.codecs.dsp import mel_filterbank, stft
from voxrelay.data.audio import resample
from voxrelay.errors import UserError

SAMPLE_RATE = 16_000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIALS_PER_SECOND = 1.3
MIN_COVERAGE = 0.75
TARGET_DBFS = -30.0
HIDDEN = 256
LAYERS = 3
EMBED_DIM = 256

VAD_WINDOW = 480  # 30 ms at 16 kHz, Resemblyzer's vad_window_length
VAD_AVERAGE_WIDTH = 8
VAD_MAX_SILENCE = 6
VOICE_THRESHOLD_DB = -40.0  # a window this far below the loudest one counts as silence
VOICE_FLOOR_DBFS = -60.0  # and so does any window quieter than this, whatever the loudest one

NOISE_PERCENTILE = 10  # the quietest 10 % of windows estimate the noise floor
NOISE_MARGIN_DB = 6.0  # a window must be this much louder than the noise floor to count as voiced
NOISE_CAP_DB = -35.0  # ... but the noise floor threshold never comes closer than this to the loudest window
_WEIGHTS_FILE = "pretrained.pt"
_INSTALL_HINT = "install voxrelay[eval] (pip install 'voxrelay[eval]') to get resemblyzer's speaker-encoder weights"


class SpeakerEncoderMissing(UserError, RuntimeError):
    """The ``resemblyzer`` wheel (which carries the encoder's weights) is not installed."""


def weights_path() -> Path:
    """Path of ``pretrained.pt`` inside the installed ``resemblyzer`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("resemblyzer")
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / _WEIGHTS_FILE
        if path.is_file():
            return path
    where = f"not in {folders}" if folders else "resemblyzer is not installed"
    raise SpeakerEncoderMissing(f"speaker-encoder weights {_WEIGHTS_FILE} not found ({where}); {_INSTALL_HINT}")


class _DVectorNet(nn.Module):
    """mels [B, T, 40] -> unit-norm embeddings [B, 256]; parameter names match ``pretrained.pt``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, EMBED_DIM)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw = torch.relu(self.linear(hidden[-1]))
        return raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)


def normalize_volume(wav: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """Scale float ``[N]`` up so that its RMS is ``target_dbfs``; louder clips are left as they are."""
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    if rms == 0.0:
        return wav
    change_db = target_dbfs - 20.0 * np.log10(rms)
    return wav if change_db < 0 else (wav * 10.0 ** (change_db / 20.0)).astype(np.float32)


def _moving_average(flags: np.ndarray, width: int) -> np.ndarray:
    padded = np.concatenate((np.zeros((width - 1) // 2), flags, np.zeros(width // 2)))
    total = np.cumsum(padded, dtype=np.float64)
    total[width:] = total[width:] - total[:-width]
    return total[width - 1 :] / width


def trim_long_silences(wav: np.ndarray) -> np.ndarray:
    """16 kHz float ``[N]`` -> the same with silences longer than ~0.2 s cut out (length <= N).

    Energy-based stand-in for Resemblyzer's webrtcvad step, with its smoothing and dilation; the
    tail that does not fill a 30 ms window is dropped, as there. A clip with no voiced window
    comes back unchanged (Resemblyzer would return it empty and then fail).
    """
    n_windows = len(wav) // VAD_WINDOW
    if n_windows == 0:
        return wav
    wav = wav[: n_windows * VAD_WINDOW]
    power = np.mean(np.square(wav.reshape(n_windows, VAD_WINDOW), dtype=np.float64), axis=1)
    db = 10.0 * np.log10(np.maximum(power, 1e-20))
    # A steady noise floor (hiss, room tone) counts as silence too, as webrtcvad's spectral model
    # has it; capped so that a clip with no pause (whose quietest windows are speech) keeps them.
    noise_floor = min(np.percentile(db, NOISE_PERCENTILE) + NOISE_MARGIN_DB, db.max() + NOISE_CAP_DB)
    voiced = db > max(db.max() + VOICE_THRESHOLD_DB, noise_floor, VOICE_FLOOR_DBFS)
    mask = np.round(_moving_average(voiced.astype(np.float64), VAD_AVERAGE_WIDTH)).astype(bool)
    # binary dilation by a window of VAD_MAX_SILENCE + 1 (centred, as scipy.ndimage does)
    width = VAD_MAX_SILENCE + 1
    padded = np.concatenate((np.zeros(width // 2, bool), mask, np.zeros(width - 1 - width // 2, bool)))
    dilated = np.lib.stride_tricks.sliding_window_view(padded, width).any(axis=1)
    if not dilated.any():
        return wav
    return wav[np.repeat(dilated, VAD_WINDOW)]


def partial_slices(n_samples: int) -> list[slice]:
    """Mel-frame slices of the partial utterances of a 16 kHz clip of ``n_samples`` (at least one).

    The slices may run past the clip's frames: the caller pads the audio with zeros first.
    """
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    step = int(np.round(SAMPLE_RATE / PARTIALS_PER_SECOND / HOP))
    starts = range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step)
    slices = [slice(s, s + PARTIAL_FRAMES) for s in starts]
    coverage = (n_samples - slices[-1].start * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < MIN_COVERAGE and len(slices) > 1:
        slices = slices[:-1]
    return slices


def mel_frames(wav: np.ndarray) -> np.ndarray:
    """16 kHz float ``[N]`` -> power mel spectrogram, float32 [1 + N // 160, 40] (frames first)."""
    power = stft(torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)), N_FFT, HOP).abs() ** 2
    fb = torch.from_numpy(mel_filterbank(SAMPLE_RATE, N_FFT, N_MELS))
    return (fb @ power).T.contiguous().numpy()


def preprocess(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """Any-rate mono float ``[N]`` -> 16 kHz, volume raised to -30 dBFS, long silences cut."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio of shape [N], got shape {wav.shape}; average the channels first")
    wav = resample(wav, sample_rate, SAMPLE_RATE)
    return trim_long_silences(normalize_volume(wav))


class SpeakerEncoder:
    """Resemblyzer's d-vector speaker encoder; build it with :meth:`load`."""

    def __init__(self, net: nn.Module, device: torch.device) -> None:
        self.net = net
        self.device = device

    @classmethod
    def load(cls, device: str | torch.device = "cpu") -> SpeakerEncoder:
        """Load the pretrained weights; raises :class:`SpeakerEncoderMissing` when they are not installed."""
        checkpoint = torch.load(weights_path(), map_location="cpu", weights_only=True)
        state = {k: v for k, v in checkpoint["model_state"].items() if k.startswith(("lstm.", "linear."))}
        net = _DVectorNet()
        net.load_state_dict(state)
        device = torch.device(device)
        return cls(net.to(device).eval(), device)

    def embed(self, wav: np.ndarray, sample_rate: int) -> np.ndarray:
        """Mono float ``[N]`` at ``sample_rate`` Hz -> speaker embedding, float32 [256], unit norm."""
        if np.asarray(wav).size == 0:
            raise ValueError("cannot embed an empty clip; pass at least a few hundred ms of speech")
        wav = preprocess(wav, sample_rate)
        slices = partial_slices(len(wav))
        wav = np.pad(wav, (0, max(0, slices[-1].stop * HOP - len(wav))))
        mels = mel_frames(wav)
        batch = torch.from_numpy(np.stack([mels[s] for s in slices])).to(self.device)
        with torch.inference_mode():
            partials = self.net(batch).cpu().numpy().astype(np.float64)
        mean = partials.mean(axis=0)
        return (mean / np.linalg.norm(mean)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings (1.0 = same direction)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if denom == 0.0:
        raise ValueError("cosine of a zero vector is undefined")
    return float(a @ b / denom)
