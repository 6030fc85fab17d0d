"""Who wrote each KV page, and a loopback wire that moves page contents between two pools.

Plain Python over any buffers that slice like arrays (the real pools' torch tensors in a
probe, numpy arrays in the lab's own tests), so the ownership check and the transport
can be tested without SGLang.

- :class:`Ledger`: every page of the decode pool carries (writer request, allocation
  generation). A page's generation grows each time the real allocator hands it out; a
  write stamps the page with its writer and the generation it landed in. Reading a page
  whose stamp names another request, or an earlier allocation, is a leak.
- :class:`Loopback`: the role of Mooncake / NIXL / Mori. It copies the *contents* of the
  prefill pages a real sender names into the decode pages the real receiver published,
  in the order the indices are given (chunk after chunk, as the senders' cumulative
  offsets do). It can hold writes back and land them later (after an abort, into pages
  the allocator has since given to someone else), or fail them. Everything it decides
  on its own is recorded in :attr:`Loopback.decisions`.
- :func:`markers_in`: the canary check -- which requests' markers a context holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MARKER_BASE = 1000
"""Marker of request number ``n`` is ``MARKER_BASE + n``; 0 is a page nobody wrote."""


def marker(number: int) -> int:
    return MARKER_BASE + number


def owner_of(value: float) -> int | None:
    """The request number a marker value names, or None for an unwritten slot."""
    n = int(round(float(value))) - MARKER_BASE
    return n if n > 0 else None


@dataclass(frozen=True)
class Stamp:
    writer: str
    generation: int


@dataclass(frozen=True)
class Foreign:
    """One read of a page the reader does not own."""

    page: int
    owner: str
    written_in: int  # generation the write landed in
    current: int  # generation of the reader's allocation


@dataclass
class Ledger:
    """(writer, generation) of every decode page; the ownership invariant checked at read time."""

    generation: dict[int, int] = field(default_factory=dict)
    stamps: dict[int, Stamp] = field(default_factory=dict)
    holder: dict[int, str] = field(default_factory=dict)

    def allocated(self, pages: Iterable[int], holder: str) -> None:
        """The allocator handed ``pages`` out (to ``holder``): a new generation of each."""
        for page in pages:
            self.generation[page] = self.generation.get(page, 0) + 1
            self.holder[page] = holder

    def written(self, pages: Iterable[int], writer: str) -> None:
        for page in pages:
            self.stamps[page] = Stamp(writer, self.generation.get(page, 0))

    def foreign(self, reader: str, pages: Iterable[int]) -> list[Foreign]:
        """The pages of ``pages`` whose content another request (or an earlier allocation) wrote."""
        found = []
        for page in pages:
            stamp = self.stamps.get(page)
            if stamp is None:
                continue  # never written: stale zeros, nobody's data
            current = self.generation.get(page, 0)
            if stamp.writer != reader or stamp.generation != current:
                found.append(Foreign(page, stamp.writer, stamp.generation, current))
        return found


@dataclass
class Write:
    """One posted transfer: these prefill pages into these decode pages."""

    room: int
    writer: str
    src_pages: tuple[int, ...]
    dst_pages: tuple[int, ...]
    last: bool
    landed: bool = False
    failed: bool = False


@dataclass
class PagedBuffers:
    """The tensors of one pool (per layer K and V, ``slots x ...``) and its page size."""

    buffers: Sequence[Any]
    page_size: int

    def slots(self, page: int) -> slice:
        return slice(page * self.page_size, (page + 1) * self.page_size)


def copy_pages(src: PagedBuffers, dst: PagedBuffers, src_pages: Sequence[int], dst_pages: Sequence[int]) -> None:
    """Copy each source page's contents into its destination page, buffer by buffer."""
    if len(src_pages) > len(dst_pages):
        raise ValueError(f"{len(src_pages)} source pages but only {len(dst_pages)} destination pages")
    for s, d in zip(src_pages, dst_pages, strict=False):
        for a, b in zip(src.buffers, dst.buffers, strict=True):
            b[dst.slots(d)] = a[src.slots(s)]


@dataclass
class Loopback:
    """The wire between one prefill and one decode pool."""

    src: PagedBuffers
    dst: PagedBuffers
    ledger: Ledger
    copy: Callable[[PagedBuffers, PagedBuffers, Sequence[int], Sequence[int]], None] = copy_pages
    destinations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    posted: list[Write] = field(default_factory=list)
    hold: bool = False
    decisions: list[str] = field(default_factory=list)
    on_last: Callable[[int], None] | None = None
    on_settled: Callable[[int], None] | None = None

    def publish(self, room: int, dst_pages: Sequence[int]) -> None:
        """Decode's receiver published where the room's pages go (``send_metadata``)."""
        self.destinations[room] = tuple(int(p) for p in dst_pages)
        self.offsets[room] = 0

    def post(self, room: int, writer: str, src_pages: Sequence[int], total_pages: int) -> Write:
        """The sender posts one chunk; it lands now unless writes are held."""
        if room not in self.destinations:
            raise KeyError(f"room {room}: no destination published")
        start = self.offsets[room]
        src = tuple(int(p) for p in src_pages)
        dst = self.destinations[room][start : start + len(src)]
        self.offsets[room] = start + len(src)
        write = Write(room, writer, src, dst, last=self.offsets[room] >= total_pages)
        self.posted.append(write)
        self.decisions.append(
            f"room {room}: prefill pages {list(src)} -> decode pages {list(dst)} in index order"
            + (" (last chunk)" if write.last else "")
        )
        if self.hold:
            self.decisions.append(f"room {room}: write of decode pages {list(dst)} held back")
        else:
            self.land(write)
        return write

    def pending(self, room: int | None = None) -> list[Write]:
        return [w for w in self.posted if not w.landed and not w.failed and (room is None or w.room == room)]

    def land(self, write: Write, *, late: bool = False) -> None:
        """The write reaches decode memory: contents copied, pages stamped with the writer."""
        self.copy(self.src, self.dst, write.src_pages, write.dst_pages)
        self.ledger.written(write.dst_pages, write.writer)
        write.landed = True
        if late:
            self.decisions.append(f"room {write.room}: held write of decode pages {list(write.dst_pages)} landed late")
        if write.last and self.on_last is not None:
            self.on_last(write.room)
        if self.on_settled is not None:
            self.on_settled(write.room)

    def fail(self, write: Write) -> None:
        """The write never reaches decode memory (the transfer engine gave up on it)."""
        write.failed = True
        self.decisions.append(f"room {write.room}: write of decode pages {list(write.dst_pages)} failed")
        if self.on_settled is not None:
            self.on_settled(write.room)


def markers_in(values: Iterable[float]) -> set[int]:
    """The request numbers whose markers appear among ``values``."""
    return {n for n in (owner_of(v) for v in values) if n is not None}
