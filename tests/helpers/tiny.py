"""A tiny run configuration for integration tests: seconds of CPU, every stage exercised."""

from __future__ import annotations

TINY = [
    "data.sources=[{type: demo, minutes: 0.6, seed: 1, voices: [en-us, en-gb+f3]}]",
    "data.eval_size=3",
    "data.shard_size=8",
    "codec.num_codebooks=2",
    "codec.codebook_size=32",
    "codec.hop_length=256",  # the demo's settings the tests were written against (the demo now has 320,
    "model.tokenizer=bytes",  # phonemes and greedy evals: tests that want those set them)
    "model.frames_per_position=null",  # the demo's model layout since issue 9: test_pipeline runs it too
    "model.text_position_scale=null",
    "model.audio_embedding=free",
    "eval.temperature=0.8",
    "codec.griffin_lim_iters=4",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "train.packing=auto",  # the default users get (the demo keeps length-sorted batches: see its config)
    "train.max_steps=6",
    "train.batch_tokens=3000",
    "train.warmup_steps=2",
    "train.eval_every=3",
    "train.eval_synth=1",
    "train.log_every=2",
    "checkpoint.every_steps=2",
    # Whisper and the speaker encoder cost seconds per process: on only where a test scores speech
    "eval.asr=null",
    "eval.speaker_similarity=false",
]


# a run that never evaluates, or never saves on its own (a final or emergency save still happens)
NO_EVALS = "train.eval_every=100000"
NO_SAVES = "checkpoint.every_steps=100000"


def tiny(root: str, *extra: str) -> list[str]:
    return [f"root={root}", *TINY, *extra]
