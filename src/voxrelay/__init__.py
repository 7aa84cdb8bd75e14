"""voxrelay: train TTS models on ephemeral GPUs with checkpoints in object storage."""

import os as _os
import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.time()  # the session clock's fallback start where /proc is not available
PARENT_AT_IMPORT = _os.getppid()  # a launcher that died before `train` asked to follow it: see host.stop_with_launcher
