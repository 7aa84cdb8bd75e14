"""One request type for synthesis and evaluation (text, speaker, description, voice prompts): a codes-only
family speaks through its codec and refuses what it cannot use; `eval --texts` reads JSONL requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from voxrelay.models.base import Request, RequestError, request_for
from voxrelay.quality.report import EvalError, read_texts


class Codec:
    sample_rate, frame_rate = 8000, 50.0

    def decode(self, codes):
        return np.repeat(codes[0].astype(np.float32) / 10, 160)


def _model():
    from tests.unit.models.test_family import tiny

    return tiny()


def test_a_codes_family_speaks_its_generated_codes_through_the_codec():
    model = _model()
    speech = model.speak(Request("hello", "b"), Codec(), max_frames=5, temperature=0.8, seed=1)
    codes = model.generate("hello", speaker="b", max_frames=5, temperature=0.8, seed=1)
    assert speech.frames == codes.shape[1] and speech.sample_rate == 8000
    np.testing.assert_array_equal(speech.wav, Codec().decode(codes))


def test_a_field_the_family_does_not_take_is_refused_or_left_out_from_data():
    model = _model()
    assert model.request_fields == ()
    with pytest.raises(RequestError, match="model.family=codec_lm takes no description"):
        model.speak(Request("hello", description="a calm voice"), Codec(), max_frames=2)
    with pytest.raises(RequestError, match="takes no voice_prompts"):
        model.speak(Request("hello", voice_prompts=(np.zeros(80, np.float32),)), Codec(), max_frames=2)
    assert request_for(model, "hi", "b", "a calm voice") == Request("hi", "b")  # a dataset's description: dropped


def test_eval_texts_read_jsonl_requests(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"text": "Hello there.", "speaker": "en-us", "description": "A calm voice."},
        {"id": "q2", "text": "Good night."},
    ]) + "\n")
    rows = read_texts(path)
    assert [(r.id, r.text, r.speaker, r.description) for r in rows] == [
        ("text-0001", "Hello there.", "en-us", "A calm voice."), ("q2", "Good night.", None, None)]
    for bad, why in [('{"text": ""}', 'no "text" string'), ("not json", "not JSON"),
                     ('{"text": "a", "speaker": 3}', "speaker must be a string")]:
        path.write_text(bad + "\n")
        with pytest.raises(EvalError, match=f"line 1: {why}"):
            read_texts(path)
