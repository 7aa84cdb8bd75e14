"""VibeVoice (seed 003): multi-speaker dialogue TTS over transformers ' VibeVoice classes."""
