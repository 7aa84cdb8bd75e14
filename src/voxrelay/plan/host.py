"""Host RAM of a run, per training process and per machine (issue 34 item 7): what ``plan`` holds against the
machine's RAM so that it never recommends a strategy the host cannot hold (FSDP's CPU offload of a 3B model
needs ~50 GB of it; a free Colab has 12.7 GB).

Per process, in bytes (``GB`` = 10**9):
- ``process``: the Python process with torch, transformers and voxrelay imported (0.36 GB RSS measured on CPU,
  torch 2.13) plus, on a GPU, what the CUDA runtime and its libraries (cuBLAS, cuDNN, NCCL) keep in host memory
  (:data:`CUDA_HOST`, an assumption);
- ``model``: the larger of two moments: loading, when the whole model sits in host memory in its load dtype
  (``model.weights_dtype``; every process builds it on CPU before it moves to the GPU, FSDP's included), and
  training under FSDP's CPU offload: this rank's shard of parameters, gradients and optimizer states, plus the
  unfused CPU AdamW step's two temporaries of the largest tensor. Offloaded tensors are pinned on CUDA (page-locked:
  they cannot be swapped out);
- ``data``: decoded shards kept in memory (``cache.ram_gb``), the batches built ahead (``train.prefetch_batches``
  + the one in use, pinned on CUDA: :data:`BATCH_BYTES_PER_TOKEN` each token, an upper bound), and the model's
  own host caches (e.g. frozen encoders' features, a family's ``feature_cache_gb``).

Per machine: every process of the run on one machine (``gpus`` of them). Not counted: the page cache (the
prepared shards on disk, safetensors files while they load: the kernel gives it back), a family's corpus held
in memory for voice prompts, and activation offload (priced by its own rows where the plan has them).
"""

from __future__ import annotations

import os
from typing import Any

from voxrelay.plan.formulas import GB, grad_bytes, optimizer_bytes, weight_bytes

GIB = 2**30
PROCESS_CPU = int(0.36 * GB)  # RSS after `import torch, transformers, accelerate, voxrelay.train.build` (measured)
CUDA_HOST = int(1.5 * GB)  # CUDA runtime + libraries in host memory once a GPU is used (assumed, not measured)
BATCH_BYTES_PER_TOKEN = 64  # int64 ids, labels, masks of a few codebooks per token: an upper bound


def host_bytes(cfg: Any, facts: Any, st: Any, tokens: int, cuda: bool = True, activations: int = 0) -> dict[str, int]:
    """Host bytes of one training process for strategy ``st`` (a :class:`voxrelay.plan.Strategy`) of the model
    in ``facts`` on micro-batches of ``tokens`` tokens, ``activations`` of them offloaded layer inputs
    (:func:`voxrelay.plan.offloaded_host_bytes`, pinned on CUDA); ``total`` is their sum, ``machine`` that of every
    process of the run on one machine."""
    params = facts.params[st.lora]
    load = weight_bytes(params)
    offload = 0
    if st.cpu_offload:
        shards = st.gpus
        largest = max((p.shard_numel(shards) * p.itemsize for p in params if p.trainable), default=0)
        offload = (weight_bytes(params, shards) + grad_bytes(params, shards)
                   + optimizer_bytes(params, st.optimizer, shards) + 2 * largest)
    caches = cfg.model.host_cache_bytes()
    data = int(cfg.cache.ram_gb * GIB) + (cfg.train.prefetch_batches + 1) * tokens * BATCH_BYTES_PER_TOKEN
    process = PROCESS_CPU + (CUDA_HOST if cuda else 0)
    total = process + max(load, offload) + data + caches + activations
    return {"process": process, "model": max(load, offload), "offload": offload, "data": data + caches,
            "activations": activations, "total": total, "machine": total * st.gpus}


def host_max_tokens(cfg: Any, facts: Any, st: Any, compute: str, host_memory: int) -> int:
    """The largest micro-batch in tokens whose host RAM per machine (:func:`host_bytes`: linear
    in tokens) fits ``host_memory`` bytes; 0 when even an empty one does not."""
    from voxrelay.plan import offloaded_host_bytes

    def machine(tokens: int) -> int:
        offloaded = offloaded_host_bytes(facts, st, tokens, compute)
        return host_bytes(cfg, facts, st, tokens, activations=offloaded)["machine"]

    base, slope = machine(0), (machine(1 << 20) - machine(0)) / (1 << 20)
    if base > host_memory:
        return 0
    return int((host_memory - base) / slope) if slope > 0 else 1 << 62


def this_machine() -> int | None:
    """Bytes of RAM of this machine (None where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
