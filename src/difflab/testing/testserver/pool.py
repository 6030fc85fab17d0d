"""A paged KV pool that, like the real one, never zeroes a page.

Pages are reference-counted so that a "phantom" (a request the pre-fix code put
back into the running batch after freeing it) can keep pages in use forever.
Freed pages go on a stack, so the next allocation reuses the most recently freed
ones: the case where stale contents are most likely to be read back.
"""

from __future__ import annotations

import threading

Token = str


class PagedKVPool:
    """``num_tokens // page_size`` pages of ``page_size`` token slots each."""

    def __init__(self, num_tokens: int, page_size: int) -> None:
        if page_size <= 0 or num_tokens < page_size:
            raise ValueError("pool must hold at least one page")
        self.page_size = page_size
        self.num_pages = num_tokens // page_size
        self._slots: list[list[Token | None]] = [[None] * page_size for _ in range(self.num_pages)]
        self._refs = [0] * self.num_pages
        self._free = list(reversed(range(self.num_pages)))  # stack: pop() hands out page 0 first
        self._lock = threading.Lock()

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def used_tokens(self) -> int:
        with self._lock:
            return sum(1 for r in self._refs if r > 0) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def alloc(self, num_tokens: int) -> list[int] | None:
        """Pages for ``num_tokens`` tokens, contents untouched; ``None`` if the pool is short."""
        need = self.pages_for(num_tokens)
        with self._lock:
            if need > len(self._free):
                return None
            pages = [self._free.pop() for _ in range(need)]
            for p in pages:
                self._refs[p] = 1
            return pages

    def free(self, pages: list[int]) -> None:
        """Drop one reference; a page with none left goes back on the stack, contents kept."""
        with self._lock:
            for p in pages:
                if self._refs[p] <= 0:
                    continue
                self._refs[p] -= 1
                if self._refs[p] == 0:
                    self._free.append(p)

    def pin(self, pages: list[int]) -> None:
        """Add a reference to each page, taking free ones off the stack (they are in use again)."""
        with self._lock:
            for p in pages:
                if self._refs[p] == 0:
                    self._free.remove(p)
                self._refs[p] += 1

    def write(self, page: int, offset: int, tokens: list[Token]) -> None:
        """Write into one page's slots starting at ``offset``, whoever owns the page now."""
        with self._lock:
            slots = self._slots[page]
            for i, tok in enumerate(tokens[: self.page_size - offset]):
                slots[offset + i] = tok

    def write_span(self, pages: list[int], tokens: list[Token]) -> None:
        for i, page in enumerate(pages):
            chunk = tokens[i * self.page_size : (i + 1) * self.page_size]
            if chunk:
                self.write(page, 0, chunk)

    def read(self, pages: list[int], num_tokens: int) -> list[Token | None]:
        """The first ``num_tokens`` slots across ``pages``: whatever is there, stale or not."""
        with self._lock:
            out: list[Token | None] = []
            for p in pages:
                out.extend(self._slots[p])
            return out[:num_tokens]
