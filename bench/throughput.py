"""Audio-seconds per second of `voxrelay train` (its loop, token-budget batches, async checkpoints at the
demo's interval) vs a Hugging Face ``Trainer`` grouping by length (``train_sampling_strategy="group_by_length"``,
``group_by_length=True`` before transformers 5) on the same model (the demo's codec_lm, the same init), the
same prepared rows and the same mean tokens per batch, in one process, runs alternating so machine noise hits
both alike.

    .venv/bin/python bench/throughput.py [--steps 40] [--repeats 3] [--root PREPARED_ROOT]

The Trainer gets a fixed batch size (its only way): the largest whose batches all stay within the same token
budget (the budget over the longest example), as a budget tuned to the GPU's memory requires. Both train
the same number of steps; audio-seconds are those of the rows each step saw, over the steps after the first 5
(ours with a checkpoint every 10 steps saved on the way; its final eval and upload left out).
Last line: ``ratio <voxrelay audio-s/s / Trainer audio-s/s>`` (goal >= 1.3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from voxrelay.cli import demo_config_path  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.data.loader import PreparedDataset  # noqa: E402
from voxrelay.data.prepare import load_index, load_prepared_codec, prepare  # noqa: E402
from voxrelay.models.base import DataSpec, pop_counts  # noqa: E402
from voxrelay.models.registry import build_model  # noqa: E402
from voxrelay.precision import settle  # noqa: E402
from voxrelay.train.build import build_run  # noqa: E402
from voxrelay.train.loop import train  # noqa: E402

DATA = ["data.sources=[{type: demo, minutes: 20, seed: 0, voices: [en-us]}]", "train.eval_every=100000",
        "monitor.tensorboard=false", "checkpoint.every_steps=10", "train.eval_synth=0"]
WARM = 5  # steps left out of both rates (the first steps warm caches up)


class _Loss(torch.nn.Module):
    """The family's loss as a module whose forward returns ``{"loss": ...}``, what a Trainer calls."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.inner = model.module

    def forward(self, **batch):
        batch.pop("num_items_in_batch", None)  # what a Trainer adds for models that take **kwargs
        ce = self.model.loss(self.inner, batch)["ce"]
        return {"loss": ce.sum / ce.count}


class _Rows(torch.utils.data.Dataset):
    def __init__(self, model, rows):
        self.examples = [dict(model.example(r), seconds=r.duration) for r in rows]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.examples[i]


def ours(root: str, name: str, steps: int) -> float:
    """Audio-s/s over the steps after the first ``WARM`` (from the run's throughput reports: the loop's own windows,
    checkpoint saves included; the final eval and upload left out, as the Trainer has none)."""
    cfg = load_config(str(demo_config_path()), [f"root={root}", f"name={name}", f"train.max_steps={steps}",
                                                f"train.log_every={WARM}", *DATA])
    train(build_run(cfg, fresh=True))
    lines = [json.loads(x) for x in (Path(root) / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    reports = [x for x in lines if "audio_sec_per_sec" in x and x["step"] % WARM == 0]
    audio = sum(b["audio_sec_per_sec"] * (b["time"] - a["time"]) for a, b in zip(reports, reports[1:], strict=False))
    return audio / (reports[-1]["time"] - reports[0]["time"])


def trainer(root: str, steps: int, tmp: str) -> float:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    cfg = load_config(str(demo_config_path()), [f"root={root}", *DATA])
    precision = settle(cfg, fresh=True, say=False).train.precision  # train.precision=auto as `voxrelay train` has it
    index = load_index(cfg.prepared_uri)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, DataSpec.from_prepared(index, load_prepared_codec(cfg.prepared_uri, index)),
                        cfg.train.seed)
    rows = [r for r in PreparedDataset.open(cfg.prepared_uri, "train", index).rows if model.length(r) <= 4096]
    data = _Rows(model, rows)
    # the largest fixed batch size whose batches all stay within the token budget, as a budget tuned to the GPU's
    # memory requires (a size from the mean length would put the longest batches over it)
    batch_size = max(1, cfg.train.batch_tokens // max(len(e["input_ids"]) for e in data.examples))
    seconds = [0.0]

    def collate(examples: list[dict]) -> dict:
        seconds[0] += sum(e["seconds"] for e in examples)
        batch = model.collate([{k: v for k, v in e.items() if k != "seconds"} for e in examples])
        pop_counts(batch)
        return batch

    args = TrainingArguments(
        output_dir=tmp, max_steps=steps, per_device_train_batch_size=batch_size,
        train_sampling_strategy="group_by_length",
        learning_rate=cfg.train.lr, warmup_steps=cfg.train.warmup_steps, lr_scheduler_type="cosine",
        bf16=precision == "bf16", fp16=precision == "fp16",
        max_grad_norm=cfg.train.clip_norm or 0.0, save_strategy="no", report_to=[], logging_steps=10**6,
        dataloader_num_workers=0, seed=cfg.train.seed, use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False, disable_tqdm=True,
    )
    marks: list[tuple[float, float]] = []  # (time, audio seconds collated) at each step's end

    class Marks(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            marks.append((time.time(), seconds[0]))

    hf = Trainer(model=_Loss(model), args=args, train_dataset=data, data_collator=collate, callbacks=[Marks()])
    hf.train()
    (t0, s0), (t1, s1) = marks[WARM - 1], marks[-1]
    return (s1 - s0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", help="a root where this bench's data is prepared already (default: prepare it)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for both sides, e.g. model.hidden_size=1024")
    args = ap.parse_args()
    DATA.extend(args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or f"{tmp}/root"
        if not args.root:
            prepare(load_config(str(demo_config_path()), [f"root={root}", *DATA]))
        a, b = [], []
        for r in range(args.repeats):
            a.append(ours(root, f"ours-{r}", args.steps))
            b.append(trainer(root, args.steps, f"{tmp}/hf-{r}"))
            print(f"repeat {r}: voxrelay {a[-1]:.1f} audio-s/s, Trainer (group_by_length) {b[-1]:.1f} audio-s/s",
                  flush=True)
    print(f"median: voxrelay {statistics.median(a):.1f}, Trainer {statistics.median(b):.1f} audio-s/s")
    print(f"ratio {statistics.median(a) / statistics.median(b):.3f}")


if __name__ == "__main__":
    main()
