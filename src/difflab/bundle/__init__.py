"""Evidence bundles: every run folder sealed as checksummed, signed, offline-verifiable evidence.

The pipeline calls :func:`seal` on the finished run folder (before renaming it into place);
``difflab verify`` / ``pack`` / ``reproduce`` work on the result. See docs/bundle.md.
"""

from difflab.bundle.sealing import SealInfo, seal

__all__ = ["SealInfo", "seal"]
