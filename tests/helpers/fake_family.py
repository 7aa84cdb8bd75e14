"""A model family that lives outside ``src/voxrelay/models/``: the proof that a family is one folder plus one
registry entry. Registered with ``VOXRELAY_FAMILIES=tests.helpers.fake_family:SPEC`` (no file of voxrelay names
it); its model (``tests/helpers/fake_family_model.py``) is a GRU over text bytes and codes, not a transformers
class, so nothing transformers-specific in the generic code can carry it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxrelay.models.seam import FamilyConfig, FamilySpec


class FakeConfig(FamilyConfig):
    """``model.family: fake``: a one-layer GRU over ``[text bytes, SEP, codes frame by frame, EOS]``."""

    family: Literal["fake"] = Field("fake", description="Model family")
    width: int = Field(32, gt=0, description="Embedding and GRU width")
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout on the embeddings")
    max_length: int = Field(1200, gt=0, description="Longest example in tokens")


SPEC = FamilySpec(
    name="fake",
    config=FakeConfig,
    build="tests.helpers.fake_family_model:build",
    load="tests.helpers.fake_family_model:load",
    summary="a test's GRU over text bytes and codes",
)
