"""The ``csm`` family against transformers' own CSM path: the processor's rendering of a conversation (chat template
+ one position per Mimi frame) and the model's loss on it, from audio, equal ours from prepared codes; previous
turns as context; the depth decoder's frames."""

from __future__ import annotations

from types import SimpleNamespace as Row

import numpy as np
import pytest
import torch

from tests.helpers.codecs_tiny import chirp, save_tiny_mimi
from tests.helpers.csm import TINY_CSM, save_csm_tokenizer
from voxrelay.models.base import DataSpec, pop_counts
from voxrelay.models.csm import conversation as cv

K = 4


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory):
    from voxrelay.codecs.mimi import MimiCodec

    base = tmp_path_factory.mktemp("csm")
    mimi = save_tiny_mimi(base / "mimi")
    return save_csm_tokenizer(base / "tok"), mimi, MimiCodec.from_pretrained(str(mimi), K)


def tiny(parts, **keys):
    from voxrelay.models.csm.build import build
    from voxrelay.models.csm.config import CsmConfig

    tok, mimi, _ = parts
    data = DataSpec(K, 2048, ["alice", "bob"], 12.5, 24000, None, {"type": "mimi", "path": str(mimi)})
    return build(CsmConfig(tokenizer=str(tok), **TINY_CSM, **keys), data, 0)


def test_a_conversation_is_laid_out_as_transformers_processor_lays_it_out_and_the_loss_is_the_models(parts):
    from transformers import AutoTokenizer, CsmProcessor, EncodecFeatureExtractor

    from voxrelay.models.csm.model import CHAT_TEMPLATE

    tok, _, codec = parts
    model = tiny(parts, train_context=True, depth_decoder_frames=1.0)
    waves = [chirp(9600, 24000, 0), chirp(5000, 24000, 1)]  # 5 frames, then 3 (a partial last frame)
    rows = [Row(id=f"r{i}", text=text, speaker=str(i), codes=codec.encode(w), conversation="c", turn=i)
            for i, (text, w) in enumerate(zip(["hello there", "the quick fox"], waves, strict=True))]
    model.use_corpus(rows)
    example = model.example(rows[1])
    assert model.length(rows[1]) == len(example["input_ids"])

    processor = CsmProcessor(EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0),
                             AutoTokenizer.from_pretrained(str(tok)), chat_template=CHAT_TEMPLATE)
    talk = [{"role": str(i), "content": [{"type": "text", "text": r.text}, {"type": "audio", "path": w}]}
            for i, (r, w) in enumerate(zip(rows, waves, strict=True))]
    labelled = {"output_labels": True, "depth_decoder_labels_ratio": 1.0}
    upstream = processor.apply_chat_template(talk, tokenize=True, return_dict=True, processor_kwargs=labelled)
    assert example["input_ids"].tolist() == upstream["input_ids"][0].tolist()

    batch = model.collate([example])
    counts = pop_counts(batch)
    assert counts == {"backbone": 5 + 1 + 3 + 1, "depth": (5 + 1 + 3 + 1) * (K - 1)}  # every frame and end frame
    with torch.no_grad():
        terms = model.loss(model.module, batch)
        theirs = model.csm(**upstream)  # transformers encodes the audio with its codec_model: the data's Mimi
    ours = sum(float(t.sum) / int(t.count) for t in terms.values())
    assert [int(t.count) for t in terms.values()] == list(counts.values())
    assert ours == pytest.approx(float(theirs.loss), rel=1e-6, abs=1e-6)
    assert float(terms["backbone"].sum) / 10 == pytest.approx(float(theirs.backbone_loss), rel=1e-6)


def test_only_the_rows_own_turn_is_learned_unless_train_context(parts):
    _, _, codec = parts
    model = tiny(parts, depth_decoder_frames=1.0)
    rows = [Row(id=f"r{i}", text="hi", speaker="alice", codes=codec.encode(chirp(3840 * (i + 1), 24000, i)),
                conversation="c", turn=i) for i in range(2)]  # 2 frames, then 4
    model.use_corpus(rows)
    counts = pop_counts(model.collate([model.example(rows[1])]))
    assert counts == {"backbone": 4 + 1, "depth": (4 + 1) * (K - 1)}


def test_context_is_the_previous_turns_nearest_first_as_many_as_fit():
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [7] * len(text)}  # one id per character

    ids = cv.Ids("B", "E", 2, 3, 0, K)
    talks = cv.Conversations(Tok(), ids, ["alice", "bob"], context_turns=2, max_len=100)
    codes = np.zeros((K, 10), dtype=np.int64)
    rows = [Row(id=f"t{t}", text="x" * 5, speaker="bob", codes=codes, conversation="a", turn=t) for t in (3, 0, 2, 1)]
    rows += [Row(id="other", text="y", speaker=None, codes=codes, conversation="b", turn=0),
             Row(id="alone", text="z", speaker=None, codes=codes, conversation=None, turn=None)]
    talks.use(rows)
    by_id = {r.id: r for r in rows}
    # a turn: "B[1]xxxxxE" (10) + 10 frames + the end frame = 21 positions
    assert [r.id for r in talks.context(by_id["t3"])] == ["t1", "t2"]  # context_turns=2, in conversation order
    assert talks.context(by_id["t0"]) == [] and talks.context(by_id["alone"]) == []
    assert talks.context(by_id["other"]) == []
    talks.max_len = 21 * 2 + 5  # room for one previous turn only: the nearest
    assert [r.id for r in talks.context(by_id["t3"])] == ["t2"] and talks.length(by_id["t3"]) == 42
    assert cv.role("bob", talks.speakers) == "1" and cv.role("3", talks.speakers) == "3"
    assert cv.role(None, talks.speakers) == "0"


def test_the_depth_decoder_learns_a_share_of_the_frames_drawn_by_the_family_generator(parts):
    model = tiny(parts, depth_decoder_frames=0.25)
    trainer, a, end = model.module, model.talks.ids.audio, model.talks.ids.audio_eos
    ids = torch.tensor([[1, 1] + [a] * 12 + [end] + [1] * 3 + [a] * 4 + [end]])
    labels = torch.full((1, ids.shape[1], K), -100)
    labels[0, 2:15] = torch.randint(0, 2048, (13, K))
    labels[0, 18:] = torch.randint(0, 2048, (5, K))
    state = trainer.generator.get_state()
    first = trainer.depth_labels(ids, labels)
    learned = ~(first[0, :, 1:] == -100).all(-1)
    assert int(learned.sum()) == cv.depth_frames(16, 0.25) + 2 == 6  # a quarter of 16 frames + the 2 end frames
    assert int(cv.counts(ids, labels, model.talks.ids, 0.25)["depth"]) == 6 * (K - 1)  # what collate counts
    assert learned[14] and learned[-1]  # the end frames always
    assert torch.equal(first[..., 0], labels[..., 0])  # the backbone learns every frame
    trainer.generator.set_state(state)
    assert torch.equal(trainer.depth_labels(ids, labels), first)  # the same state: the same frames
    others = [trainer.depth_labels(ids, labels) for _ in range(4)]
    assert any(not torch.equal(o, first) for o in others)  # the generator moves on: other frames next step


@pytest.mark.parametrize("share", [0.25, 1.0])
@pytest.mark.parametrize("dims", [(256, 512, 4, 2, 128, 512, 2), (192, 768, 6, 3, 96, 384, 4)],
                         ids=lambda d: f"{d[0]}-depth{d[4]}")
def test_plan_prices_the_depth_decoder_beside_the_backbone(parts, share, dims):
    """The activations ``voxrelay plan`` predicts for a CSM step (backbone per position, the depth decoder's share
    of the frames priced outside its layers, the backbone's saved log-softmax) against the bytes autograd saves in
    fp32, plus the depth head's gathered weights (a per-step constant plan leaves out): within -3% / +10%."""
    from tests.unit.test_plan import saved_bytes
    from voxrelay.plan.formulas import activation_bytes, logits_bytes

    k = 8
    h, i, heads, kv, dh, di, dheads = dims
    tok, mimi, _ = parts
    from voxrelay.models.csm.build import build
    from voxrelay.models.csm.config import CsmConfig

    cfg = CsmConfig(tokenizer=str(tok), hidden_size=h, intermediate_size=i, num_heads=heads, num_kv_heads=kv,
                    num_layers=2, depth_hidden_size=dh, depth_intermediate_size=di, depth_heads=dheads,
                    depth_layers=2, depth_decoder_frames=share)
    model = build(cfg, DataSpec(k, 2048, [], 12.5, 24000, None, {"type": "mimi", "path": str(mimi)}), 0)
    s = 96
    ids = torch.full((1, s), 5)
    ids[0, 10:95], ids[0, 95] = model.talks.ids.audio, model.talks.ids.audio_eos
    labels = torch.full((1, s, k), -100)
    labels[0, 10:] = torch.randint(0, 2048, (86, k))
    batch = {"input_ids": ids, "codes": labels.clamp(min=0), "attention_mask": torch.ones_like(ids), "labels": labels}
    params = {p.untyped_storage().data_ptr() for p in model.module.parameters()}
    measured = sum(n for ptr, n in saved_bytes(lambda: model.loss(model.module, batch)).items() if ptr not in params)
    shape = model.plan_shape()
    head = (k - 1) * dh * 2051 * 4
    predicted = activation_bytes(shape, s, "fp32", False) + logits_bytes(shape.vocab, s, peak=False) + head
    assert 0.97 <= predicted / measured <= 1.10, (predicted, measured)


def test_a_scripts_labels_are_csm_speaker_ids_and_an_unknown_id_is_refused_naming_the_voices(parts, caplog):
    from voxrelay.models.base import Request, RequestError
    from voxrelay.models.csm.generation import turns_of

    model = tiny(parts)  # voices alice (0) and bob (1)
    assert turns_of(model, Request("Speaker 1: hi\nSpeaker 1: again")) == [("1", "hi"), ("1", "again")]
    assert turns_of(model, Request("Speaker 1: a\nSpeaker 0: b")) == [("1", "a"), ("0", "b")]
    assert turns_of(model, Request("[SPEAKER_A] a [SPEAKER_B] b")) == [("0", "a"), ("1", "b")]
    assert turns_of(model, Request("hello", speaker="bob")) == [("1", "hello")]
    with pytest.raises(RequestError, match=r"Speaker 5: is none of this model's voices \(Speaker 0: = alice, "
                                           r"Speaker 1: = bob\)"):
        turns_of(model, Request("Speaker 0: a\nSpeaker 5: b"))
    assert turns_of(model, Request("Speaker 1: a", speaker="bob")) == [("1", "a")]
    assert "voice 'bob' does not apply to it" in caplog.text  # --voice beside a script: said, not silently dropped
    assert turns_of(model, Request("Speaker 0: a\nSpeaker 1: b", speaker="alice")) == [("0", "a"), ("1", "b")]
