"""``parler`` models in upstream's own formats: ``export --format parler`` (a folder upstream's
``ParlerTTSForConditionalGeneration.from_pretrained`` loads and ``generate``s from, the DAC included) and the
adapter of a LoRA run as peft files on upstream's module names (``PeftModel.from_pretrained`` on upstream's class).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxrelay.codecs.dac_keys import descript_layout_differences, transformers_dac_config
from voxrelay.errors import UserError
from voxrelay.models.parler import keymap
from voxrelay.models.parler.modeling import ParlerConfig

if TYPE_CHECKING:
    from voxrelay.models.parler.model import Parler

# what AutoPeftModel imports to rebuild the base of an adapter: upstream's class, not ours
UPSTREAM_CLASS = {"base_model_class": "ParlerTTSForConditionalGeneration",
                  "parent_library": "parler_tts.modeling_parler_tts"}


KEPT = {"peft_type", "task_type", "r", "lora_alpha", "target_modules", "inference_mode"}


class ExportError(UserError, ValueError):
    """The model or its codec cannot be written in upstream's format; the message says what to do instead."""


def save_adapter(module: Any, folder: Path, base: str | None) -> None:
    """A LoRA ``module`` (PeftModel over a ParlerModule, whose module names are upstream's) as peft's
    ``adapter_config.json`` + ``adapter_model.safetensors``, naming upstream's class and ``base`` (the run's
    ``model.init_from``) as the model to apply it to."""
    import peft

    module.save_pretrained(str(folder))
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    # only what differs from peft's defaults (and what says what this is): a peft of upstream's time (0.13,
    # beside transformers 4.46) refuses the keys later versions added, even at their defaults
    defaults = json.loads(json.dumps(peft.LoraConfig().to_dict(), default=str))
    config = {k: v for k, v in config.items() if k in KEPT or k not in defaults or v != defaults[k]}
    config |= {"auto_mapping": UPSTREAM_CLASS, "base_model_name_or_path": base}
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


def upstream_config(config: ParlerConfig, audio_encoder: dict | None = None) -> dict[str, Any]:
    """Upstream's ``config.json`` for ``config`` (ParlerTTSConfig with its three sub-configs)."""
    dec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config.decoder).items()}
    eos, bos = config.decoder.eos_token_id, config.decoder.bos_token_id
    dec |= {"model_type": "parler_tts_decoder", "pad_token_id": eos, "architectures": ["ParlerTTSForCausalLM"],
            "layerdrop": 0.0, "scale_embedding": False, "is_decoder": True, "add_cross_attention": True}
    return {"model_type": "parler_tts", "architectures": ["ParlerTTSForConditionalGeneration"],
            "text_encoder": config.text_encoder, "audio_encoder": audio_encoder or config.audio_encoder,
            "decoder": dec, "vocab_size": config.prompt_vocab_size,
            "prompt_cross_attention": False, "pad_token_id": eos,
            "decoder_start_token_id": bos, "is_encoder_decoder": True}


def audio_encoder_config(codec: Any) -> tuple[str, dict[str, Any]]:
    """(DAC layout for :func:`keymap.to_upstream_state`, ``audio_encoder`` of config.json) for the run's DAC."""
    dac_config = codec.model.config
    if descript_layout_differences(dac_config):
        return "transformers", transformers_dac_config(dac_config)
    return "descript", {"model_type": "dac_on_the_hub", "num_codebooks": codec.num_codebooks,
                        "codebook_size": codec.codebook_size, "latent_dim": int(dac_config.hidden_size),
                        "frame_rate": int(codec.frame_rate), "sampling_rate": codec.sample_rate, "model_bitrate": 8}


def save_upstream(model: Parler, folder: Path, codec: Any) -> None:
    """Upstream's own format (``export --format parler``): ``config.json``, ``model.safetensors`` with every weight
    under upstream's names, ``generation_config.json``, and the transcript tokenizer at the root as upstream's
    training saves it (the description tokenizer in ``description_tokenizer/``):
    ``ParlerTTSForConditionalGeneration.from_pretrained(folder)`` loads it. The DAC goes as upstream's descript
    wrapper (``dac_on_the_hub``, weight-normed under ``audio_encoder.model.*``, as mini v0.1/v1 ship it) when it
    has descript's 44.1 kHz layout, the only one that wrapper builds; any other DAC as transformers' ``DacModel``
    (``model_type`` "dac" with every size, plain weights under ``audio_encoder.*``, as mini v1.1 ships it)."""
    from safetensors.torch import save_file

    from voxrelay.models.parler.loading import DESCRIPTION_TOKENIZER

    dac = getattr(codec, "model", None)
    if getattr(codec, "name", None) != "dac" or dac is None:
        raise ExportError(f"export --format parler needs the run's codec to be a DAC (codec.type=dac), not "
                              f"{getattr(codec, 'name', codec)!r}; export without --format")
    folder.mkdir(parents=True, exist_ok=True)
    module = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module
    config = module.config
    ours = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    dac_state = {k: v.detach().cpu().contiguous() for k, v in dac.state_dict().items()}
    layout, audio = audio_encoder_config(codec)
    state = keymap.to_upstream_state(ours, config, dac=dac_state, dac_layout=layout)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    frame_rate = int(codec.frame_rate)  # upstream's 86 for 44.1 kHz / 512 (transformers' DacConfig says 87)
    (folder / "config.json").write_text(json.dumps(upstream_config(config, audio), indent=2))
    eos, bos = config.decoder.eos_token_id, config.decoder.bos_token_id
    # as upstream's save_pretrained writes it (+ the sampling defaults of released checkpoints); generate() starts
    # every codebook with bos_token_id; "_from_model_config" false: upstream keeps this file as it is
    generation = {"bos_token_id": bos, "decoder_start_token_id": bos, "pad_token_id": eos, "eos_token_id": eos,
                  "do_sample": True, "max_length": 30 * frame_rate, "_from_model_config": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    model.prompt_tokenizer.save_pretrained(str(folder))
    model.description_tokenizer.save_pretrained(str(folder / DESCRIPTION_TOKENIZER))
