"""The peak of live tensor bytes on CPU, what ``torch.cuda.max_memory_allocated`` is on a GPU (less its
512-byte block rounding): a dispatch mode that sees every storage an op creates, its ``resize_`` (FSDP2 frees
and refills its unsharded parameters that way) and, by a weak reference, its release.

    peak = Peak()
    peak.adopt(tensors_that_already_exist)
    with peak:
        ...
    peak.peak, peak.now
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from voxrelay.train.offload import ActivationOffload


def _storages(t: object) -> Iterator[torch.UntypedStorage]:
    """The storages behind ``t``: its own, or those of a wrapper subclass' inner tensors (DTensor's shard)."""
    if not isinstance(t, torch.Tensor):
        return
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from _storages(getattr(t, name))
    else:
        yield t.untyped_storage()


class Peak(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.now = 0
        self.peak = 0
        self._resize = None
        self._elsewhere = False

    def _count(self, delta: int) -> None:
        self.now += delta
        self.peak = max(self.peak, self.now)

    def _add(self, st: torch.UntypedStorage) -> None:
        if st in self.sizes or st.device.type == "meta":
            return
        size = [st.nbytes()]  # a box: resize_ changes it, the release returns what it then holds
        self.sizes[st] = size
        self._count(size[0])
        weakref.finalize(st, lambda: self._count(-size[0]))

    def adopt(self, tensors: Iterable[object]) -> None:
        """Count tensors that existed before (parameters, buffers)."""
        for t in tensors:
            for st in _storages(t):
                self._add(st)

    @contextlib.contextmanager
    def elsewhere(self) -> Iterator[None]:
        """Storages made inside are not counted: what a GPU run holds in host memory (activation offload's copies)."""
        self._elsewhere = True
        try:
            yield
        finally:
            self._elsewhere = False

    def reset(self) -> None:
        """Start a new peak from what is live now."""
        self.peak = self.now

    def __enter__(self):
        original = self._resize = torch.UntypedStorage.resize_
        sizes = self.sizes

        def resize_(st, n):
            box = sizes.get(st)
            if box is None:
                out = original(st, n)
                self._add(st)
                return out
            self._count(n - box[0])
            box[0] = n
            return original(st, n)

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._elsewhere:
            self.adopt(tree_leaves(out))
        return out


class HostCopies(ActivationOffload):
    """``train.activation_offload`` as a GPU runs it, on a CPU: the pack copies the tensor to a host store that
    ``peak`` does not count (the device tensor is freed once the forward drops it), the unpack makes a new
    device copy (counted). Values pass through both copies, so a run with it must equal one without."""

    def __init__(self, peak: Peak | None = None) -> None:
        self.peak = peak
        super().__init__(pin_memory=False)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        with self.peak.elsewhere() if self.peak is not None else contextlib.nullcontext():
            return tensor.detach().clone()

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return host.clone().to(device)


def _orpheus(tokenizer: Path, h: int, heads: int, kv: int, layers: int, *more: str) -> list[str]:
    return ["model.family=orpheus", f"model.tokenizer={tokenizer}", f"model.hidden_size={h}",
            f"model.num_heads={heads}", f"model.num_kv_heads={kv}", f"model.intermediate_size={3 * h}",
            f"model.num_layers={layers}", "train.max_steps=100", "model.dropout=0.0", *more]


def _batch(model, family: str, tokens: int) -> dict:
    rng = np.random.default_rng(0)
    if family == "orpheus":  # audio ids of the 156,940-way vocabulary, every position labelled
        ids = rng.integers(128_266, 156_940, tokens)
        return model.collate([{"input_ids": ids, "labels": ids.copy()}])
    from voxrelay.data.shards import EncodedUtterance

    frames = (tokens - 40) // 4  # codec_lm: 4 codes per frame after a short text
    example = model.example(EncodedUtterance("x", "a sentence to read aloud", None, None, 1.0,
                                             rng.integers(0, 256, (4, frames))))
    return model.collate([example])


def step_peak(overrides: list[str], tokens: int) -> tuple[int, dict, int]:
    """(peak of live tensor bytes over a training step after the first, the plan's bytes for the same config
    priced with the unfused optimizer CPU runs, the micro-batch's tokens)."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from voxrelay.config import load_config
    from voxrelay.models.registry import as_trained, build_model
    from voxrelay.plan import compute_mode, configured, per_gpu
    from voxrelay.plan.model import data_spec, model_facts
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import train_step
    from voxrelay.train.offload import offload_checkpoints
    from voxrelay.train.state import seed_everything

    cfg = load_config(None, overrides)
    had_group = dist.is_initialized()
    AcceleratorState._reset_state()  # one per process; these rows differ in mixed precision
    try:
        seed_everything(0)
        model = build_model(as_trained(cfg.model, cfg.train), data_spec(cfg, None), 0)
        run = bare_run(model, cfg, Accelerator(mixed_precision=cfg.train.precision, cpu=True))
        batch = _batch(model, cfg.model.family, tokens)
        n = int(batch["attention_mask"].sum())
        peak = Peak()
        if cfg.train.activation_offload:  # what the GPU would hold: the layer inputs go to an uncounted host store
            assert offload_checkpoints(run.model.module, HostCopies(peak))
        peak.adopt([*run.module.parameters(), *run.module.buffers()])
        with peak:
            for step in range(2):  # the first step creates the optimizer's states; the second is the steady one
                if step == 1:
                    peak.reset()
                train_step(run, [dict(batch, audio_seconds=1.0)])
    finally:  # leave the process as it was for whatever runs next in it (other tests' Accelerator, group)
        AcceleratorState._reset_state()
        if dist.is_initialized() and not had_group:  # FSDP's world of one
            dist.destroy_process_group()
    facts, _ = model_facts(cfg, None)
    st = configured(cfg, 1)
    return peak.peak, per_gpu(facts, st, n, compute_mode(cfg, st.strategy), fused=False), n


# Training steps held to the plan (tests/unit/test_plan_peak.py, bench/plan_accuracy.py), on shapes no constant
# was fitted on. Attention dropout is 0: on CPU SDPA with dropout keeps tokens x tokens per head (the math
# path); on a GPU flash attention keeps only its RNG state, which is what the plan prices.
# name -> (family, (hidden, heads, kv heads, layers), overrides, tokens, the phase the plan finds at the peak)
CPU_ROWS = {
    # the 156,940-way loss outweighs a small model: the peak is the log-softmax's backward
    "ddp-full-fp32-loss": ("orpheus", (320, 5, 1, 2), ["train.precision=no", "train.chunked_loss=false"], 512,
                           "loss"),
    # the same head's loss a chunk at a time (train.chunked_loss), the head frozen (LoRA, no modules_to_save):
    # one chunk of logits is the peak's part of the loss, not 12 bytes x vocab x tokens
    "ddp-lora-fp32-chunked": ("orpheus", (256, 4, 1, 1), ["train.precision=no",
                                                          "train.lora.modules_to_save=[]"], 512, "loss"),
    # under bf16 autocast, the head trained in full: its gradient is made with the loss, and at the backward's
    # end one more copy of it exists (with 512-token chunks at 1,024 tokens the loss phase is the peak: 0.998)
    "ddp-full-autocast-chunked": ("orpheus", (256, 4, 1, 1), ["train.precision=bf16",
                                                              "train.loss_chunk_tokens=128"], 512, "end"),
    # a wide model on a few tokens: the peak is the optimizer step (gradients + its temporaries), 8-bit states.
    # These two price the materialised loss: with the chunked one the backward's end ties with the step (the
    # plan 1.000 of the measured peak either way, but the phase named is then "end")
    "ddp-8bit-fp32-step": ("orpheus", (512, 8, 2, 1), ["train.precision=no", "train.optimizer=adamw_8bit",
                                                            "train.chunked_loss=false"], 24,
                           "step"),
    # Lion (voxrelay's own, tensor by tensor on a GPU too): the step's temporaries
    "ddp-lion-fp32-step": ("orpheus", (512, 8, 2, 1), ["train.precision=no", "train.optimizer=lion",
                                                           "train.chunked_loss=false"], 24, "step"),
    # FSDP2 (one process) with LoRA and checkpointing: frozen base, adapters, modules_to_save copies
    "fsdp-lora-gc-fp32": ("orpheus", (384, 6, 2, 2), ["train.precision=no", "train.strategy=fsdp",
                                                      "train.lora.embeddings=full",
                                                      "train.gradient_checkpointing=true"], 128,
                          "end"),
    # LoRA's default under bf16 (model.weights_dtype auto): the frozen base in bf16, adapters in fp32, under autocast
    "ddp-lora-gc-bf16-base": ("orpheus", (256, 4, 2, 2), ["train.precision=bf16", "train.lora=true",
                                                          "train.gradient_checkpointing=true"], 128, "loss"),
    # bf16 autocast over fp32 master weights with checkpointing: the recomputed layer's weight copies
    "ddp-gc-autocast": ("codec_lm", (384, 6, 6, 3), ["train.precision=bf16", "train.gradient_checkpointing=true",
                                                     "model.frames_per_position=null",
                                                     "model.text_position_scale=null",
                                                     "model.audio_embedding=free",
                                                     # chunked: the same peak (1.067 either way), but the
                                                     # backward's end then ties with the layers' phase
                                                     "train.chunked_loss=false"], 520, "layers"),
    # QLoRA: the layers' frozen Linears in NF4 (codes + double-quantised absmax), adapters and the trained embedding
    # and head in fp32; one weight dequantised at a time in backward. (int8 is not held here: on CPU bitsandbytes
    # trains it through MatMul8bitFp, which keeps each Linear's input on its autograd context, out of reach of
    # checkpointing: +(3h + I) x 4 bytes per token per layer, measured; a GPU takes the MatMul8bitLt path)
    "ddp-qlora4-gc-fp32": ("codec_lm", (512, 8, 8, 2), ["train.precision=no", "train.lora.base_bits=4",
                                                       "train.gradient_checkpointing=true",
                                                       "model.frames_per_position=null",
                                                       "model.text_position_scale=null",
                                                       "model.audio_embedding=free",
                                                       "train.chunked_loss=false"], 256, "layers"),
    # the same with activation offload, deep enough that the layer inputs are ~1/8 of the peak: the GPU's peak is
    # the loss' without them (a plan that kept them on the GPU would be 13.5% over)
    "ddp-gc-offload-autocast": ("codec_lm", (96, 2, 2, 16), ["train.precision=bf16",
                                                            "train.gradient_checkpointing=true",
                                                            "train.activation_offload=true",
                                                            "model.frames_per_position=null",
                                                            "model.text_position_scale=null",
                                                            "model.audio_embedding=free",
                                                            "train.chunked_loss=false"], 1024, "loss"),
}


def row_overrides(name: str, tokenizer: Path) -> list[str]:
    family, (h, heads, kv, layers), more, _, _ = CPU_ROWS[name]
    if family == "orpheus":
        return _orpheus(tokenizer, h, heads, kv, layers, *more)
    return [f"model.hidden_size={h}", f"model.num_heads={heads}", f"model.intermediate_size={3 * h}",
            f"model.num_layers={layers}", "train.max_steps=100", "model.dropout=0.0", *more]


H200 = Path(__file__).resolve().parents[1] / "fixtures" / "plan" / "h200_max_allocated.json"
# the defaults the H200 rows ran with (stop 25, before issue 34): fp32 weights under LoRA too, embed_tokens/lm_head
# trained in full (as_recorded), the backward inside autocast's region (cached_through_backward)
RECORDED_WITH = ["model.weights_dtype=float32"]


def as_recorded(overrides: list[str]) -> list[str]:
    """A recorded row's overrides with the LoRA defaults it ran with."""
    return ["train.lora.embeddings=full" if o == "train.lora=true" else o for o in overrides]


def cached_through_backward(facts, overrides: list[str]) -> int:
    """What the code these rows were measured on (stop 25) held beyond today's: its backward ran inside the autocast
    region, whose cache kept a bf16 copy of every trainable fp32 Linear weight of the layers to the backward's end;
    under checkpointing, where the loss' backward is the peak, that is all but the recomputed layer's copies
    (today's train_step frees them with the forward: measured in tests/unit/train/test_autocast_backward.py).
    Re-measure the rows on a GPU to drop this."""
    if "train.gradient_checkpointing=true" not in overrides or "train.strategy=fsdp" in overrides:
        return 0  # without checkpointing every matmul saves its copy for backward anyway; FSDP2 computes in pure bf16
    lora = "train.lora=true" in overrides
    copies = sum(2 * p.numel for p in facts.params[lora] if p.linear and p.in_layer and p.trainable and p.itemsize == 4)
    return copies - copies // facts.shape[lora].layers


def recorded_plan(overrides: list[str], tokens: int, facts=None) -> dict:
    """The plan's bytes (same code as ``voxrelay plan``) for a config the H200 measured; ``facts`` of a config
    sharing its model (they hold both the full and the LoRA model) spare a meta build."""
    from voxrelay.config import load_config
    from voxrelay.plan import compute_mode, configured, per_gpu
    from voxrelay.plan.model import model_facts

    cfg = load_config(None, overrides)
    facts = facts if facts is not None else model_facts(cfg, None)[0]
    st = configured(cfg, 1)
    return per_gpu(facts, st, tokens, compute_mode(cfg, st.strategy))
