"""The ``model:`` section of a run config when ``model.family: causal_lm``: any transformers causal LM over a codec's
codes, laid out as a declared :class:`~voxrelay.models.causal_lm.layout.Layout` says.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and ``config show``
import it).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.causal_lm.layout import Layout, built_in_names, from_dict, load_layout
from voxrelay.models.lora_config import WEIGHTS_DTYPE_HELP, WeightsDtype
from voxrelay.models.seam import FamilyConfig

RANDOM_ONLY = "Random init only (None: the layout's random_init)"


class CausalLMConfig(FamilyConfig):
    """A transformers causal LM whose sequences are text + codec codes in a declared layout (``model.layout``: a
    built-in one, e.g. ``llasa``, or your own YAML file; docs/layouts.md). Fine-tuning starts from ``init_from``
    (a checkpoint of the layout's model keeps its audio tokens; its base LM gets the layout's tokens added); without
    it the model is random and ``tokenizer`` names the base LM's tokenizer."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: Literal["causal_lm"] = Field(
        "causal_lm", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    layout: str = Field(
        ..., description=f"The token layout: a built-in one ({', '.join(built_in_names())}) or a YAML file of your "
        "own (docs/layouts.md)",
    )
    layout_spec: dict[str, Any] | None = Field(
        None, description="Written by voxrelay, leave unset: the layout's content, read from model.layout when the "
        "config is loaded; a run keeps it (its folder needs no layout file) and a resume compares it field by field",
    )
    init_from: str | None = Field(
        None, description="Pretrained weights: local folder or hub id of the layout's model (e.g. HKUSTAudio/Llasa-1B) "
        "or of its base LM (e.g. meta-llama/Llama-3.2-1B-Instruct: the layout's tokens are added); None = random",
    )
    tokenizer: str | None = Field(None, description="Tokenizer folder or hub id (None = the one of init_from)")
    loss_on: Literal["all", "speech"] | None = Field(
        None, description="all: loss on the whole sequence; speech: on the audio ids and the tokens after them (and "
        "the layout's labelled_prompt_tail); None: the layout's",
    )
    drop_repeated_frames: bool | None = Field(
        None, description="Leave out of each training example a frame whose first code repeats the previous frame's "
        "(Orpheus' upstream preparation); None: the layout's",
    )
    add_tokens: list[str] = Field(
        [], description="Tokens added to the tokenizer after the layout's, e.g. the characters of a new language its "
        "tokenizer splits or does not know (`voxrelay prepare --check-text` lists them); their embedding rows are new "
        "and, under LoRA, train alone (train.lora.embeddings: new_rows)",
    )
    max_seq_len: int | None = Field(None, gt=0, description="Longest training sequence in tokens (None: the layout's)")
    dropout: float = Field(0.0, ge=0, lt=1, description="Attention dropout")
    weights_dtype: WeightsDtype = Field("auto", description=WEIGHTS_DTYPE_HELP)
    hidden_size: int | None = Field(None, gt=0, description=f"{RANDOM_ONLY}: transformer width")
    num_layers: int | None = Field(None, gt=0, description=f"{RANDOM_ONLY}: transformer layers")
    num_heads: int | None = Field(None, gt=0, description=f"{RANDOM_ONLY}: attention heads")
    num_kv_heads: int | None = Field(None, gt=0, description=f"{RANDOM_ONLY}: key/value heads")
    intermediate_size: int | None = Field(None, gt=0, description=f"{RANDOM_ONLY}: MLP width")

    @model_validator(mode="before")
    @classmethod
    def _read_layout(cls, data: Any) -> Any:
        """The layout file's content into ``layout_spec`` (a saved run's config has it already: no file read)."""
        if isinstance(data, dict) and data.get("layout") and data.get("layout_spec") is None:
            data = {**data, "layout_spec": load_layout(str(data["layout"])).model_dump(mode="json")}
        return data

    @model_validator(mode="after")
    def _layout(self) -> CausalLMConfig:
        lay = self.resolved()  # a bad layout is refused with the config
        init = lay.random_init
        heads = self.num_heads or init.num_heads
        if (self.hidden_size or init.hidden_size) % heads or heads % (self.num_kv_heads or init.num_kv_heads):
            raise ValueError("hidden_size must be divisible by num_heads and num_heads by num_kv_heads")
        return self

    def resolved(self) -> Layout:
        """The run's layout: its recorded content (``layout_spec``), else the file ``layout`` names."""
        if self.layout_spec is None:
            return load_layout(self.layout)
        return _parsed(json.dumps(self.layout_spec, sort_keys=True), self.layout)

    def seq_len(self) -> int:
        return self.max_seq_len or self.resolved().max_seq_len

    def data_needs(self) -> DataNeeds:
        """The layout's codec: its codes per frame and codebook size (a section built without keys, as asked for the
        family's facts alone, has no layout: any codes)."""
        if "layout" not in self.__dict__:
            return DataNeeds()
        lay = self.resolved()
        return DataNeeds(codes=(lay.codebooks, lay.codebook_size), codec=lay.codec.type)

    def text_coverage(self, texts: list[str]) -> list[tuple[str, int, str]] | None:
        """The characters of ``texts`` (as the model reads them: phonemized where the layout says so) the tokenizer
        does not know or splits into several tokens, with their counts and how they are tokenized
        (``model.add_tokens`` adds those that can be added)."""
        from collections import Counter

        from voxrelay.models.causal_lm.loading import add_extra, load_tokenizer, tokenizer_source

        lay = self.resolved()
        tok = load_tokenizer(tokenizer_source(self, lay), "model.tokenizer" if self.tokenizer else "model.init_from",
                             lay)
        add_extra(tok, self.add_tokens)
        if lay.phonemize is not None:
            from voxrelay.models.causal_lm.phonemes import phonemes

            how = lay.phonemize
            texts = [phonemes(t, how.language, how.preserve_punctuation, how.with_stress) for t in texts]
        found = []
        for char, count in Counter("".join(texts)).most_common():
            if char.isspace():
                continue
            ids = tok.encode(char, add_special_tokens=False)
            if len(ids) > 1 or (tok.unk_token_id is not None and tok.unk_token_id in ids):
                unknown = tok.unk_token_id is not None and tok.unk_token_id in ids
                how = "unknown" if unknown else f"{len(ids)} tokens"
                if char in tok.get_vocab():  # a byte-level BPE's byte symbol: as a token it would read as that byte
                    how += " (cannot be added: the byte alphabet uses it)"
                found.append((char, count, how))
        return found


@functools.lru_cache(maxsize=16)
def _parsed(spec: str, name: str) -> Layout:
    return from_dict(json.loads(spec), f"model.layout_spec (layout {name})")

