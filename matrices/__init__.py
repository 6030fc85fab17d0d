"""The default matrix (``upstream.toml``) and the release lock (``releases.lock``); shipped as ``difflab.matrices``."""
