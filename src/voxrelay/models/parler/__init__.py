"""Parler-TTS (mini v0.1 / v1 / v1.1): weight-compatible model core in plain torch + transformers parts."""
