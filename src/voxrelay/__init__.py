"""voxrelay: train TTS models on ephemeral GPUs with checkpoints in object storage."""

import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.time()  # the session clock's fallback start where /proc is not available
