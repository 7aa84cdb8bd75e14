"""voxrelay: train TTS models on ephemeral GPUs with checkpoints in object storage."""
__version__ = "0.1.0"
