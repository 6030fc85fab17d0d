"""The prefill radix tree and KV pools, faked at the edge of GPU memory.

SGLang's real ``release_kv_cache`` (``mem_cache/common.py``) runs unchanged and
decides whether a finished request's KV is kept by the radix tree; only the
tree and pools it talks to are recorders. Their API moved between releases,
so the fake offers the union (a strict fake forbids missing names, not extra
ones): ``cache_finished_req(req, is_insert=...)`` up to 0.5.20,
``insert_req`` in 0.5.21, ``checkpoint`` from 0.5.22.

A fix that quarantines a failed room's KV may add a tree method the probe
cannot know by name yet; a method whose name mentions quarantine is answered
by a :class:`Sink` that records each call, instead of failing the probe. A
quarantine *flag* or container on the tree is not guessed: reading one is a
probe error. State a fork keeps on its own scheduler comes from the fork's
constructor (:mod:`harness.strict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, MissingFakeAttribute, Recorder, StrictFake

QUARANTINE_NAME = re.compile("quarantin", re.IGNORECASE)


@dataclass
class Sink:
    """Stands in for an unknown quarantine *method* of the tree: callable, and records each use.

    It is never a value: reading it as a flag, a container or a number (``if
    tree.quarantine_enabled``) is a probe error, because the probe cannot know
    what the fork's tree would answer.
    """

    kit: Kit
    name: str
    uses: list[str]

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.uses.append(self.name)

    def __getattr__(self, item: str) -> Sink:
        if item.startswith("__"):
            raise AttributeError(item)
        return Sink(self.kit, f"{self.name}.{item}", self.uses)

    def _not_a_value(self, *args: Any) -> Any:
        self.kit.missing_attributes.append(f"tree_cache.{self.name} (read as a value)")
        raise MissingFakeAttribute(f"fake tree_cache.{self.name} was read as a value; the probe cannot know it")

    __bool__ = __len__ = __iter__ = __eq__ = __int__ = __index__ = _not_a_value  # type: ignore[assignment]
    __hash__ = object.__hash__


class _QuarantineTolerantFake(StrictFake):
    def __getattr__(self, item: str) -> Any:
        if QUARANTINE_NAME.search(item):
            uses: list[str] = object.__getattribute__(self, "_quarantine_uses")
            sink = Sink(object.__getattribute__(self, "_kit"), item, uses)
            object.__setattr__(self, item, sink)
            return sink
        return super().__getattr__(item)


@dataclass
class TreeCache:
    """The fake tree cache and what was asked of it."""

    fake: StrictFake
    calls: dict[str, Recorder]
    quarantine_uses: list[str] = field(default_factory=list)

    def count(self, name: str) -> int:
        return self.calls[name].count


def fake_prefill_tree_cache(kit: Kit) -> TreeCache:
    """A tree cache whose pools give a request's row back the way the real ones do."""
    from harness.requests import drop_kv

    def cache_finished_req(req: Any, *args: Any, **kwargs: Any) -> None:
        drop_kv(req)  # <= 0.5.20: the cache itself frees the request's row

    def pool_free(req: Any) -> None:
        req.kv.req_pool_idx = None  # what ReqToTokenPool.free does to the request

    calls = {
        "cache_finished_req": kit.recorder("tree_cache.cache_finished_req", side_effect=cache_finished_req),
        "insert_req": kit.recorder("tree_cache.insert_req"),
        "checkpoint": kit.recorder("tree_cache.checkpoint"),
        "free_kv_row": kit.recorder("tree_cache.free_kv_row"),
        "on_release": kit.recorder("tree_cache.on_release"),
        "finish": kit.recorder("tree_cache.finish"),
        "release_aborted_request": kit.recorder("tree_cache.release_aborted_request"),
        "req_to_token_pool.free": kit.recorder("req_to_token_pool.free", side_effect=pool_free),
    }
    uses: list[str] = []
    fake = _QuarantineTolerantFake(
        kit,
        "tree_cache",
        supports_mamba=kit.recorder("tree_cache.supports_mamba", returns=False),
        claim_kv_row=kit.recorder("tree_cache.claim_kv_row", returns=False),
        unpin=kit.recorder("tree_cache.unpin"),
        unlock=kit.recorder("tree_cache.unlock"),
        req_to_token_pool=kit.fake("req_to_token_pool", free=calls["req_to_token_pool.free"]),
        token_to_kv_pool_allocator=kit.fake("token_to_kv_pool_allocator", page_size=1),
        **{k: v for k, v in calls.items() if "." not in k},
    )
    object.__setattr__(fake, "_quarantine_uses", uses)
    return TreeCache(fake=fake, calls=calls, quarantine_uses=uses)
