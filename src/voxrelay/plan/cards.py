"""The cheap cards ``voxrelay plan`` knows: memory torch can use, native bf16, dense peak tensor TFLOPS and prices
per GPU-hour (USD, on-demand and spot), and the Colab profiles with their host RAM (issue 34 items 6, 7).

Memory: ``torch.cuda.mem_get_info`` on an idle card where measured (A100 40/80 GB, H100, L4, T4, A10G: the
presets ``plan`` had); the others are the card's nominal memory (as nvidia-smi lists it) less 0.6 GiB for the
CUDA context (not measured).

bf16: compute capability 8.0 and up computes in bf16 natively (Ampere, Ada, Hopper); T4 (7.5) and V100 (7.0) do
not (torch emulates it, several times slower): ``train.precision=auto`` trains there in fp16 with a loss scaler.

Peak: NVIDIA's datasheets, dense (no sparsity) fp16/bf16 tensor-core TFLOPS with fp32 accumulation (what training
uses; GeForce cards run that at half their fp16-accumulate rate): T4 65, V100 SXM2 125, L4 121, RTX 3090 71,
RTX 4090 165, A100 312, L40S 362, H100 SXM 989, H200 989; A10G 70 (not published: the A10's 125 at the A10G's
lower clocks and power, an assumption).

Prices (USD per GPU-hour; a cloud's price for a whole machine of one GPU, its CPU and RAM included, where the GPU
is not sold alone). Checked 2026-11-28 through stored copies of the pages (this machine has no network):
- RunPod (RTX 3090, RTX 4090, L4, L40S, A100 80 GB PCIe, H100 SXM, H200), spot and on-demand, as of March 2026:
  https://www.runpod.io/pricing, tabulated at https://deploybase.ai/articles/runpod-gpu-pricing;
- Google Cloud us-central1 (T4, V100, A100 40 GB), GPU price alone, on-demand and spot:
  https://cloud.google.com/compute/gpus-pricing and https://cloud.google.com/spot-vms/pricing. NOT re-checked:
  no stored copy of the GPU price table was found on 2026-11-28 (the spot page's stored copy lists vCPU/memory
  rates only and says spot prices change up to once a day); these are 2025 list prices as we last read them;
- AWS us-east-1 g5.xlarge (one A10G, 4 vCPU, 16 GiB): on-demand $1.006/h in June 2026
  (https://www.factualminds.com/blog/amazon-ec2-on-demand-pricing-instance-families-2026/, from AWS's rate card,
  https://aws.amazon.com/ec2/instance-types/g5/); spot $0.40, AWS's typical ~60% discount (not a quoted price:
  https://aws.amazon.com/ec2/spot/pricing/ shows live prices only).
Prices drift: ``cost.gpu_hour`` in the run's config overrides them all (one price per GPU-hour, whatever the card).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
GB = 10**9


@dataclass(frozen=True)
class Card:
    """One kind of GPU: ``memory`` bytes torch can use, ``bf16`` native, ``tflops`` dense bf16/fp16 peak with
    fp32 accumulation, ``on_demand`` / ``spot`` USD per GPU-hour (None: not offered), ``where`` the price's source."""

    key: str
    label: str
    memory: int
    bf16: bool
    tflops: float
    on_demand: float | None
    spot: float | None
    where: str


_RUNPOD, _GCP, _AWS = "RunPod", "Google Cloud", "AWS"
CARDS: dict[str, Card] = {c.key: c for c in (
    Card("t4", "Tesla T4 16GB", int(14.6 * GIB), False, 65, 0.35, 0.14, _GCP),
    Card("v100", "Tesla V100 16GB", int(15.2 * GIB), False, 125, 2.48, 0.99, _GCP),
    Card("l4", "L4 24GB", int(22.0 * GIB), True, 121, 0.78, 0.44, _RUNPOD),
    Card("a10g", "A10G 24GB", int(22.0 * GIB), True, 70, 1.006, 0.40, _AWS),
    Card("rtx3090", "RTX 3090 24GB", int(23.4 * GIB), True, 71, 0.39, 0.22, _RUNPOD),
    Card("rtx4090", "RTX 4090 24GB", int(23.4 * GIB), True, 165, 0.60, 0.34, _RUNPOD),
    Card("a100-40gb", "A100 40GB", int(39.4 * GIB), True, 312, 2.93, 1.17, _GCP),
    Card("l40s", "L40S 48GB", int(44.4 * GIB), True, 362, 1.40, 0.79, _RUNPOD),
    Card("a100-80gb", "A100 80GB", int(79.1 * GIB), True, 312, 2.10, 1.19, _RUNPOD),
    Card("h100", "H100 80GB", int(79.1 * GIB), True, 989, 4.76, 2.69, _RUNPOD),
    Card("h200", "H200 141GB", int(139.8 * GIB), True, 989, 6.35, 3.59, _RUNPOD),
)}


@dataclass(frozen=True)
class Profile:
    """A machine users rent as one thing: a card and the host RAM that comes with it (Colab's runtimes)."""

    key: str
    card: str
    host_memory: int
    note: str


# host RAM as Colab's resource panel shows it for each runtime (the free T4: 12.7 GB, the figure of seed 002's
# user and issue 34; Colab Pro's L4: 53 GB; A100: 83.5 GB), not measured by us
PROFILES: dict[str, Profile] = {p.key: p for p in (
    Profile("colab-t4", "t4", int(12.7 * GB), "free Colab, T4 runtime"),
    Profile("colab-l4", "l4", int(53.0 * GB), "Colab Pro, L4 runtime"),
    Profile("colab-a100", "a100-40gb", int(83.5 * GB), "Colab Pro, A100 runtime"),
)}


def card_named(name: str) -> tuple[Card, Profile | None] | None:
    """The card (and the profile, for a Colab one) of ``--gpu NAME``; None when unknown."""
    key = name.strip().lower()
    if key in PROFILES:
        return CARDS[PROFILES[key].card], PROFILES[key]
    return (CARDS[key], None) if key in CARDS else None


def known_names() -> list[str]:
    return [*CARDS, *PROFILES]


def gpu_hour(card: Card, spot: bool, override: float | None) -> float | None:
    """USD per GPU-hour of ``card``: ``cost.gpu_hour`` when set, else the table's spot or on-demand price."""
    if override is not None:
        return override
    return card.spot if spot else card.on_demand
