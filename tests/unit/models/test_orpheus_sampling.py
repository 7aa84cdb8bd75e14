"""Orpheus samples as upstream's inference of a fine-tuned model does by default (transformers' generate in the
fine-tuning notebook Orpheus' README links, unslothai/notebooks Orpheus_(3B)-TTS: top_p 0.95,
repetition_penalty 1.1), each token processed exactly as transformers' own logits processors
process it (issue 32 item 7); `synthesize --top-p/--repetition-penalty` and `eval.top_p/repetition_penalty`
set them, and a family that does not sample with them refuses them."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from voxrelay.models.base import DataSpec, RequestError, sampling_options
from voxrelay.models.orpheus import layout as L
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.registry import build_model
from voxrelay.models.sampling import process

UPSTREAM = {"top_p": 0.95, "repetition_penalty": 1.1}  # the notebook's model.generate(...) call


def transformers_processed(logits: torch.Tensor, seen: list[int], temperature: float, top_k: int | None,
                           top_p: float | None, penalty: float | None) -> torch.Tensor:
    """What transformers' generate does to a [N] row of logits before it samples, in its order."""
    ids, scores = torch.tensor([seen]), logits[None].clone()
    steps = ([RepetitionPenaltyLogitsProcessor(penalty)] if penalty else []) + [TemperatureLogitsWarper(temperature)]
    steps += ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p else [])
    for step in steps:
        scores = step(ids, scores)
    return scores[0]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "penalty"), [
    (0.8, 50, 0.8, 1.3), (0.6, None, 0.95, 1.1), (1.0, 50, None, 1.3), (0.7, None, 0.5, None), (1.3, 7, 0.9, 0.9),
])
def test_processing_is_transformers_processors(temperature, top_k, top_p, penalty) -> None:
    logits = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 3  # positive and negative logits
    seen = [3, 3, 17, 250, 299, 0, 17]  # repeats count once
    ours = process(logits, temperature, top_k, top_p, penalty, torch.tensor(seen))
    assert torch.equal(ours, transformers_processed(logits, seen, temperature, top_k, top_p, penalty))


@pytest.fixture(scope="module")
def orpheus(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("orpheus-sampling")
    folder = save_tiny_llama(d / "orpheus", save_llama3_tokenizer(d / "tokenizer"), seed=1)
    return build_model(OrpheusConfig(init_from=str(folder), max_seq_len=512), DataSpec(7, 4096, ["tara"]), 0)


def test_orpheus_draws_each_token_from_transformers_processed_logits_with_upstreams_defaults(orpheus) -> None:
    """Replayed without the KV cache: at each step the candidates upstream decoding keeps (position k's 4,096
    audio ids; end_of_speech at a frame boundary), the logits processed by transformers' processors with
    upstream's top_p and penalty over the prompt and what came before, drawn from the same seeded generator."""
    frames, seed = 2, 5
    codes = orpheus.generate("hello there", "tara", max_frames=frames, seed=seed)  # defaults: voxrelay's t/k
    seq = orpheus.prompt_ids("hello there", "tara")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for step in range(frames * L.CODES_PER_FRAME):
            logits = orpheus.module(input_ids=torch.tensor([seq])).logits[0, -1].float()
            lo = int(L.OFFSETS[step % L.CODES_PER_FRAME])
            ids = list(range(lo, lo + L.CODEBOOK_SIZE)) + ([L.END_OF_SPEECH] if step and step % 7 == 0 else [])
            masked = torch.full_like(logits, float("-inf"))
            masked[ids] = logits[ids]
            scores = transformers_processed(masked, seq, 0.8, 50, UPSTREAM["top_p"], UPSTREAM["repetition_penalty"])
            seq.append(ids[int(torch.multinomial(scores.softmax(-1)[ids], 1, generator=generator))])
            if seq[-1] == L.END_OF_SPEECH:
                break
    assert codes.tolist() == L.ids_to_codes(seq).tolist()
    assert codes.shape[1] >= 1


def test_top_p_and_penalty_are_refused_by_a_family_that_does_not_sample_with_them(orpheus) -> None:
    from tests.unit.models.test_family import tiny

    assert sampling_options(orpheus, top_p=None, repetition_penalty=1.1) == {"repetition_penalty": 1.1}
    with pytest.raises(RequestError, match="model.family=codec_lm .* leave top_p unset"):
        sampling_options(tiny(), top_p=0.9)
