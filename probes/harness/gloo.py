"""A real single-rank gloo process group for SGLang's cross-rank consensus.

``pop_transferred`` MIN-reduces poll states over the attention-TP gloo group
(``_all_reduce_polls``) and, from 0.5.23, also agrees which failed transfers
to hold (``all_reduce_flags``). Both ask ``torch.distributed.get_world_size``
first, which needs a real, initialised group; with one rank the reduction is
the identity, so nothing is faked.
"""

from __future__ import annotations

from typing import Any


def single_rank_group() -> Any:
    """The default process group, initialised once per process as a 1-rank gloo group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD
