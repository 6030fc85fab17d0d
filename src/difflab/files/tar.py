"""Tar entries that say nothing about the machine they were made on.

Shared by the evidence bundle (``difflab pack``) and the Docker image's root filesystem:
both must read the same wherever they are built.
"""

from __future__ import annotations

import tarfile


def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """uid/gid 0 and no user or group names (the builder's account is not part of the content)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
