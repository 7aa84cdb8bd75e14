"""The built-in codec: log-mel frames quantised by residual k-means, decoded by Griffin-Lim.

Needs no download: it is fitted on the corpus during ``prepare``. Quality is modest (FACTS.md:
MCD-DTW about 10 dB with 4 x 256 against a Griffin-Lim floor of about 7 dB) but it lets the whole
pipeline run offline on a CPU.

    codec = MelKMeansCodec.from_config(cfg.codec)
    codec.fit(wavs, seed=0)                # list of float32 [N] at codec.sample_rate
    codes = codec.encode(wav)              # int64 [num_codebooks, 1 + N // hop_length]
    wav_hat = codec.decode(codes)          # float32 [(T - 1) * hop_length]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from voxrelay.codecs import dsp
from voxrelay.errors import ConfigError

if TYPE_CHECKING:
    from voxrelay.config import CodecConfig

_CENTROIDS_KEY = "centroids"
_LLOYD_ITERS = 10
# k-means++ seeding is O(frames x centroids); a subsample keeps it cheap without hurting the fit.
_SEEDING_MAX_FRAMES = 20_000
# Rows of the frames x centroids distance matrix computed at once (bounds memory to ~32 MB).
_CHUNK = 32_768


def _nearest(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [N, D], centroids: [C, D] -> (index int64 [N], squared distance float32 [N])."""
    c_sq = (centroids * centroids).sum(1)
    idx, dist = [], []
    for start in range(0, x.shape[0], _CHUNK):
        xs = x[start : start + _CHUNK]
        d = c_sq[None, :] - 2.0 * (xs @ centroids.T)  # ||x||^2 is constant per row: add it after argmin
        best, i = d.min(1)
        idx.append(i)
        dist.append((best + (xs * xs).sum(1)).clamp_min(0.0))
    return torch.cat(idx), torch.cat(dist)


def _kmeans_pp(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ seeding: x [N, D] -> k rows of x, float32 [k, D]."""
    first = int(torch.randint(x.shape[0], (1,), generator=gen))
    centroids = [x[first]]
    closest = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = float(closest.sum())
        if total <= 0.0:  # every point already coincides with a centroid: pick any
            i = int(torch.randint(x.shape[0], (1,), generator=gen))
        else:
            i = int(torch.multinomial(closest / total, 1, generator=gen))
        centroids.append(x[i])
        closest = torch.minimum(closest, ((x - x[i]) ** 2).sum(1))
    return torch.stack(centroids)


def fit_kmeans(x: torch.Tensor, k: int, n_iter: int, gen: torch.Generator) -> torch.Tensor:
    """Lloyd's k-means with k-means++ seeding: x float32 [N, D] -> centroids float32 [k, D].

    An empty cluster is re-seeded with the point that is currently worst represented.
    """
    sub = x[torch.randperm(x.shape[0], generator=gen)[:_SEEDING_MAX_FRAMES]]
    centroids = _kmeans_pp(sub, k, gen)
    for _ in range(n_iter):
        idx, dist = _nearest(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, idx, x)
        counts = torch.bincount(idx, minlength=k).to(x.dtype)
        new = sums / counts.clamp_min(1.0)[:, None]
        empty = torch.nonzero(counts == 0).flatten()
        if len(empty):
            worst = torch.topk(dist, len(empty)).indices
            new[empty] = x[worst]
        centroids = new
    return centroids


class MelKMeansCodec:
    """Log-mel (Slaney mel of STFT magnitude, natural log) + residual k-means + Griffin-Lim.

    Codes: int64 [num_codebooks, T] with T = 1 + N // hop_length; code k of a frame indexes
    stage k's centroids, and the sum of the chosen centroids approximates the frame's log-mel.
    """

    name = "mel_kmeans"

    def __init__(
        self,
        sample_rate: int = 16000,
        n_fft: int = 1024,
        hop_length: int = 256,
        n_mels: int = 80,
        num_codebooks: int = 4,
        codebook_size: int = 256,
        fit_max_frames: int = 200_000,
        griffin_lim_iters: int = 32,
    ) -> None:
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.n_mels = n_mels
        self.num_codebooks = num_codebooks
        self.codebook_size = codebook_size
        self.fit_max_frames = fit_max_frames
        self.griffin_lim_iters = griffin_lim_iters
        self.frame_rate = sample_rate / hop_length
        self._centroids: torch.Tensor | None = None  # float32 [num_codebooks, codebook_size, n_mels]
        self._fb: np.ndarray | None = None  # cached mel filterbank [n_mels, n_fft // 2 + 1]

    @classmethod
    def from_config(cls, cfg: CodecConfig) -> MelKMeansCodec:
        return cls(
            sample_rate=cfg.sample_rate,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            n_mels=cfg.n_mels,
            num_codebooks=cfg.num_codebooks,
            codebook_size=cfg.codebook_size,
            fit_max_frames=cfg.fit_max_frames,
            griffin_lim_iters=cfg.griffin_lim_iters,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.name,
            "sample_rate": self.sample_rate,
            "n_fft": self.n_fft,
            "hop_length": self.hop_length,
            "n_mels": self.n_mels,
            "num_codebooks": self.num_codebooks,
            "codebook_size": self.codebook_size,
            "fit_max_frames": self.fit_max_frames,
            "griffin_lim_iters": self.griffin_lim_iters,
        }

    # -- features -------------------------------------------------------------------------------

    @property
    def filterbank(self) -> np.ndarray:
        """Mel filterbank, float32 [n_mels, n_fft // 2 + 1] (built on first use)."""
        if self._fb is None:
            self._fb = dsp.mel_filterbank(self.sample_rate, self.n_fft, self.n_mels)
        return self._fb

    def features(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] -> log-mel frames float32 [T, n_mels] (natural log of mel magnitude)."""
        wav = np.asarray(wav)
        if wav.ndim != 1 or wav.size == 0:
            raise ValueError(
                f"{self.name}: expected mono audio float32 [N] with N > 0, got shape {wav.shape}; "
                "mix down to mono and drop empty clips first"
            )
        if not np.isfinite(wav).all():
            raise ValueError(f"{self.name}: audio contains NaN or inf samples; fix or drop the clip")
        return dsp.log_mel(wav.astype(np.float32), self.filterbank, self.n_fft, self.hop_length).T

    # -- fitting --------------------------------------------------------------------------------

    @property
    def is_fitted(self) -> bool:
        return self._centroids is not None

    def fit(self, wavs: list[np.ndarray], seed: int = 0) -> None:
        """Fit the residual k-means on at most ``fit_max_frames`` frames sampled with ``seed``.

        wavs: float32 [N] mono clips at ``sample_rate``. Deterministic for a given (wavs, seed).
        """
        if not wavs:
            raise ValueError(f"{self.name}: fit() got no clips; pass a non-empty list of float32 [N] arrays")
        frames = np.concatenate([self.features(w) for w in wavs])
        if frames.shape[0] < self.codebook_size:
            rate = self.sample_rate / self.hop_length
            raise ConfigError(  # a user's setting against a user's data: exit 2, no traceback
                f"{self.name}: {frames.shape[0]} frames of audio ({frames.shape[0] / rate:.0f} s) are too few to fit "
                f"codec.codebook_size={self.codebook_size} centroids; prepare more audio (at least "
                f"{self.codebook_size / rate:.0f} s in the training split) or lower codec.codebook_size (e.g. "
                f"codec.codebook_size={max(16, 2 ** int(np.log2(max(frames.shape[0] // 4, 1))))})")
        rng = np.random.default_rng(seed)
        if frames.shape[0] > self.fit_max_frames:
            frames = frames[np.sort(rng.choice(frames.shape[0], self.fit_max_frames, replace=False))]
        gen = torch.Generator().manual_seed(seed)
        residual = torch.from_numpy(np.ascontiguousarray(frames))
        stages = []
        for _ in range(self.num_codebooks):
            centroids = fit_kmeans(residual, self.codebook_size, _LLOYD_ITERS, gen)
            idx, _ = _nearest(residual, centroids)
            residual = residual - centroids[idx]
            stages.append(centroids)
        self._centroids = torch.stack(stages).contiguous()

    def _require_fitted(self) -> torch.Tensor:
        if self._centroids is None:
            raise RuntimeError(
                f"{self.name} codec is not fitted; call fit(wavs) or load_state_bytes(...) "
                "with the state saved by prepare before encode/decode"
            )
        return self._centroids

    def code_vectors(self) -> np.ndarray:
        """The log-mel vector each code stands for: float32 [num_codebooks, codebook_size, n_mels] (the
        residual stages' centroids), for ``model.audio_embedding: codec``."""
        return self._require_fitted().numpy().copy()

    # -- codes ----------------------------------------------------------------------------------

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav float32 [N] at ``sample_rate`` -> codes int64 [num_codebooks, 1 + N // hop_length]."""
        centroids = self._require_fitted()
        residual = torch.from_numpy(np.ascontiguousarray(self.features(wav)))
        codes = []
        for stage in centroids:
            idx, _ = _nearest(residual, stage)
            residual = residual - stage[idx]
            codes.append(idx)
        return torch.stack(codes).numpy().astype(np.int64)

    def codes_to_log_mel(self, codes: np.ndarray) -> np.ndarray:
        """codes int [num_codebooks, T] -> log-mel float32 [n_mels, T] (sum of the chosen centroids)."""
        centroids = self._require_fitted()
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_codebooks:
            raise ValueError(
                f"{self.name}: codes must be int [{self.num_codebooks}, T], got shape {codes.shape}"
            )
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"{self.name}: codes must lie in [0, {self.codebook_size}), got range "
                f"[{codes.min()}, {codes.max()}]; were they made by a codec with another codebook_size?"
            )
        idx = torch.from_numpy(codes.astype(np.int64))
        stage = torch.arange(self.num_codebooks)[:, None]
        return centroids[stage, idx].sum(0).T.numpy()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes int [num_codebooks, T] -> wav float32 [(T - 1) * hop_length] (deterministic)."""
        return self.log_mel_to_wav(self.codes_to_log_mel(codes))

    def log_mel_to_wav(self, log_mel: np.ndarray) -> np.ndarray:
        """log-mel float32 [n_mels, T] -> wav float32 [(T - 1) * hop_length] by pseudo-inverse + Griffin-Lim."""
        if log_mel.shape[1] < 2:
            return np.zeros(0, dtype=np.float32)
        fb_pinv = torch.from_numpy(np.linalg.pinv(self.filterbank).astype(np.float32))
        mag = (fb_pinv @ torch.from_numpy(np.exp(log_mel).astype(np.float32))).clamp_min(0.0)
        wav = dsp.griffin_lim(mag, self.n_fft, self.hop_length, self.griffin_lim_iters)
        return wav.numpy().astype(np.float32)

    # -- state ----------------------------------------------------------------------------------

    def state_bytes(self) -> bytes:
        """Fitted centroids as safetensors bytes (key ``centroids``: float32 [K, C, n_mels])."""
        centroids = self._require_fitted()
        return save_safetensors({_CENTROIDS_KEY: centroids}, metadata={"type": self.name})

    def load_state_bytes(self, data: bytes) -> None:
        """Load centroids saved by :meth:`state_bytes`; the shape must match this codec's parameters."""
        tensors = load_safetensors(data)
        if _CENTROIDS_KEY not in tensors:
            raise ValueError(
                f"{self.name}: state has no {_CENTROIDS_KEY!r} tensor (keys: {sorted(tensors)}); "
                "pass the bytes written by MelKMeansCodec.state_bytes()"
            )
        centroids = tensors[_CENTROIDS_KEY].to(torch.float32)
        expected = (self.num_codebooks, self.codebook_size, self.n_mels)
        if tuple(centroids.shape) != expected:
            raise ValueError(
                f"{self.name}: state holds centroids of shape {tuple(centroids.shape)} but this codec "
                f"expects {expected} (num_codebooks, codebook_size, n_mels); build the codec from the "
                "same describe() dict that was saved with the state"
            )
        self._centroids = centroids.contiguous()
