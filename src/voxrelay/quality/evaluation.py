"""One evaluation of a model, shared by training's evals (:mod:`voxrelay.train.evaluate`) and ``voxrelay eval``
(:mod:`voxrelay.quality.report`) so that both give the same numbers on the same checkpoint: the same context
(:func:`eval_context`: the family's eval weights, e.g. an EMA of its weights; its generators and the process RNG
seeded from ``train.seed``), the same sampling seeds (``step * 1000 + i``) and the same parts, each guarded on its
own (:class:`EvalParts`): a part that fails is a warning naming it, counted in ``eval/failed_parts``, and what the
other parts computed is still logged (an eval that disappeared whole would hide its loss from early stopping and
keep_best)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from voxrelay.errors import one_line
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.samples import generate_samples, held_out_loss
from voxrelay.quality.scorer import ASR_KEY, Sample
from voxrelay.train.state import rng_state, seed_everything, seed_generators, set_rng_state

log = logging.getLogger(__name__)
FAILED_PARTS = "eval/failed_parts"  # how many parts of an eval failed (absent when none did)


class EvalParts:
    """The parts of the eval of ``step`` (loss, sample generation, WER/CER, speaker similarity, each sink), each
    run in :meth:`part`: an exception there is a warning naming the part, and the eval goes on. ``fatal``: exception
    types that are the caller's, not a part's (``voxrelay eval``: bad input, exit 2). ``progress``: called after
    each loss batch and each sample (training renews its lease while the eval makes progress, so an eval longer
    than the lease's progress bound keeps it, and a hung one does not)."""

    def __init__(self, step: int, fatal: tuple[type[BaseException], ...] = (),
                 progress: Callable[[], object] = lambda: None):
        self.step = step
        self.fatal = fatal
        self.progress = progress
        self.failed: list[str] = []

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        try:
            yield
        except self.fatal:
            raise
        except Exception as err:  # noqa: BLE001 (any failure of one part: the others still count)
            self.failed.append(name)
            log.warning("eval of step %d: %s failed (%s: %s); the rest of this eval is logged", self.step, name,
                        type(err).__name__, one_line(err)[:300])

    def metrics(self) -> dict[str, float]:
        return {FAILED_PARTS: float(len(self.failed))} if self.failed else {}


@contextlib.contextmanager
def eval_context(model, seed: int) -> Iterator[None]:
    """What every eval runs in: the weights the family evaluates with (e.g. an EMA swapped in), its generators and
    this process's RNG seeded from ``seed`` alike in every eval and on every rank (comparable losses from one eval to
    the next, and ``voxrelay eval`` of a checkpoint gives the numbers training logged), and afterwards the training
    states given back: an eval must not change what training draws next (a resumed run, which evaluates at other
    steps, would diverge)."""
    gens = model.generators()
    saved, saved_gens = rng_state(), {name: g.get_state() for name, g in gens.items()}
    seed_everything(seed)
    seed_generators(gens, seed, rank=-1)
    try:
        with model.eval_weights():
            yield
    finally:
        for name, g in gens.items():
            g.set_state(saved_gens[name])
        set_rng_state(saved)


@dataclass
class EvalResult:
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)  # one row per sample: id, text, transcript, wer, ...


def evaluate_model(model, codec, loss_rows: list | None, synth_rows: list, step: int, seed: int, cfg: EvalConfig,
                   scorer, parts: EvalParts, module: torch.nn.Module | None = None,
                   device: torch.device = torch.device("cpu"), autocast=contextlib.nullcontext) -> EvalResult:
    """The eval of ``model`` at ``step``: the held-out loss over ``loss_rows`` (None: not measured; ``module``, the
    module as trained, e.g. DDP-wrapped), ``synth_rows`` spoken with seeds ``step * 1000 + i`` and ``cfg``'s
    sampling, scored by ``scorer`` (None: not scored), each part guarded by ``parts``."""
    out = EvalResult()
    with eval_context(model, seed):
        if loss_rows is not None:
            with parts.part("loss"):
                out.metrics |= held_out_loss(model, module or model.module, loss_rows, device, autocast,
                                              parts.progress)
        if synth_rows:
            with parts.part("sample generation"):
                out.samples, synth = generate_samples(model, codec, synth_rows, step * 1000,
                                                      temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                                      repetition_penalty=cfg.repetition_penalty,
                                                      progress=parts.progress)
                out.metrics |= synth
        if scorer is not None and out.samples:  # the speaker encoder draws from the RNG as it loads: inside
            scores, out.scores = scorer.score(out.samples, parts)
            out.metrics |= scores
            if "eval/wer" in scores:  # the one text beside the numbers: what the WER/CER were measured with
                out.metrics[ASR_KEY] = scorer.yardstick()
    return out
