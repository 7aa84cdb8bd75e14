"""VibeVoice (seed 003): multi-speaker dialogue TTS over the VibeVoice classes of transformers."""
