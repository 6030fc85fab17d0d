"""The page-ownership check and the loopback wire, on plain arrays (no SGLang needed).

The pair probes' verdicts rest on two pieces of lab code: the ledger that says
who wrote a page, and the wire that moves page contents. A checker that stops
seeing foreign writers, or a wire that zeroes or misplaces pages, must fail here.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from difflab.paths import shipped_probes

PROBES = shipped_probes()  # the checkout's probes/ (under mutation, the mutated copy beside the copied package)


@pytest.fixture(scope="module")
def pages():
    sys.path.insert(0, str(PROBES))
    try:
        yield importlib.import_module("harness.pages")
    finally:
        sys.path.remove(str(PROBES))


PAGE = 4


def pool(pages_mod, n_pages: int = 8):
    k = np.zeros((n_pages * PAGE + PAGE, 1, 2), dtype=np.float32)
    v = np.zeros_like(k)
    return pages_mod.PagedBuffers([k, v], PAGE)


def write_marker(buffers, page: int, number: int, pages_mod) -> None:
    for b in buffers.buffers:
        b[buffers.slots(page)] = pages_mod.marker(number)


def test_a_page_written_by_another_request_is_foreign(pages) -> None:
    ledger = pages.Ledger()
    ledger.allocated([1, 2], "a")
    ledger.written([1, 2], "a")
    assert ledger.foreign("a", [1, 2]) == []
    ledger.allocated([1, 2], "b")  # a freed them, the allocator gave them to b
    ledger.written([1], "b")
    found = ledger.foreign("b", [1, 2])
    assert [(f.page, f.owner, f.written_in, f.current) for f in found] == [(2, "a", 1, 2)]


def test_a_write_into_an_earlier_allocation_is_foreign_even_from_the_reader(pages) -> None:
    ledger = pages.Ledger()
    ledger.allocated([3], "a")
    ledger.written([3], "a")
    ledger.allocated([3], "a")  # the same name, a new allocation (a retried request)
    assert [f.page for f in ledger.foreign("a", [3])] == [3]


def test_a_page_nobody_wrote_is_not_a_leak(pages) -> None:
    ledger = pages.Ledger()
    ledger.allocated([5], "a")
    assert ledger.foreign("a", [5]) == []


def test_the_wire_copies_contents_in_index_order(pages) -> None:
    src, dst = pool(pages), pool(pages)
    ledger = pages.Ledger()
    for page, number in ((2, 7), (5, 8)):
        write_marker(src, page, number, pages)
    wire = pages.Loopback(src, dst, ledger)
    wire.publish(room=1, dst_pages=[6, 3])
    wire.post(1, "r7", [2, 5], total_pages=2)
    assert pages.markers_in(dst.buffers[0][dst.slots(6)].ravel()) == {7}
    assert pages.markers_in(dst.buffers[1][dst.slots(3)].ravel()) == {8}
    assert ledger.stamps[6].writer == "r7" and ledger.stamps[3].writer == "r7"
    assert "prefill pages [2, 5] -> decode pages [6, 3]" in wire.decisions[0]


def test_chunks_continue_where_the_last_one_ended(pages) -> None:
    src, dst = pool(pages), pool(pages)
    wire = pages.Loopback(src, dst, pages.Ledger())
    done: list[int] = []
    wire.on_last = done.append
    wire.publish(room=4, dst_pages=[1, 2, 3])
    first = wire.post(4, "r", [5], total_pages=3)
    second = wire.post(4, "r", [6, 7], total_pages=3)
    assert (first.dst_pages, first.last) == ((1,), False)
    assert (second.dst_pages, second.last) == ((2, 3), True)
    assert done == [4]


def test_a_held_write_lands_late_into_whoever_holds_the_pages_now(pages) -> None:
    src, dst = pool(pages), pool(pages)
    ledger = pages.Ledger()
    write_marker(src, 1, 1, pages)
    wire = pages.Loopback(src, dst, ledger, hold=True)
    ledger.allocated([4], "donor")
    wire.publish(room=9, dst_pages=[4])
    write = wire.post(9, "donor", [1], total_pages=1)
    assert wire.pending(9) == [write]
    assert pages.markers_in(dst.buffers[0][dst.slots(4)].ravel()) == set()
    ledger.allocated([4], "victim")  # freed at once on abort, reallocated
    wire.land(write, late=True)
    found = ledger.foreign("victim", [4])
    assert [(f.owner, f.written_in, f.current) for f in found] == [("donor", 2, 2)]
    assert pages.markers_in(dst.buffers[0][dst.slots(4)].ravel()) == {1}
    assert any("landed late" in d for d in wire.decisions)


def test_a_failed_write_never_lands(pages) -> None:
    src, dst = pool(pages), pool(pages)
    write_marker(src, 1, 3, pages)
    wire = pages.Loopback(src, dst, pages.Ledger(), hold=True)
    wire.publish(room=2, dst_pages=[1])
    write = wire.post(2, "r", [1], total_pages=1)
    wire.fail(write)
    assert wire.pending(2) == [] and not write.landed
    assert pages.markers_in(dst.buffers[0].ravel()) == set()


def test_a_zeroing_wire_is_caught_by_the_canary(pages) -> None:
    """What the pair's canary check relies on: a wire that zeroes instead of copying shows no marker."""
    src, dst = pool(pages), pool(pages)
    write_marker(src, 1, 5, pages)

    def zeroing(a, b, src_pages, dst_pages) -> None:
        for d in dst_pages:
            for buf in b.buffers:
                buf[b.slots(d)] = 0

    honest = pages.Loopback(src, dst, pages.Ledger())
    honest.publish(1, [2])
    honest.post(1, "r", [1], total_pages=1)
    assert pages.markers_in(dst.buffers[0][dst.slots(2)].ravel()) == {5}
    other = pool(pages)
    broken = pages.Loopback(src, other, pages.Ledger(), copy=zeroing)
    broken.publish(1, [2])
    broken.post(1, "r", [1], total_pages=1)
    assert pages.markers_in(other.buffers[0][other.slots(2)].ravel()) == set()


def test_more_source_pages_than_destinations_is_refused(pages) -> None:
    with pytest.raises(ValueError, match="destination pages"):
        pages.copy_pages(pool(pages), pool(pages), [1, 2], [3])


def test_markers_name_their_request(pages) -> None:
    assert pages.owner_of(pages.marker(3)) == 3
    assert pages.owner_of(0.0) is None
    assert pages.markers_in([0.0, pages.marker(2), pages.marker(2), pages.marker(4)]) == {2, 4}


# -- difflab fuzz: input checks and the result's own logic (no SGLang) -----------------------------


def test_fuzz_refuses_bad_input_before_anything_runs(tmp_path) -> None:
    from difflab.errors import ConfigError
    from difflab.workflows.fuzz import FuzzRequest, check

    bad = [
        (FuzzRequest(out=tmp_path / "o"), "either --release"),
        (FuzzRequest(release="0.5.19", ref="main", out=tmp_path / "o"), "either --release"),
        (FuzzRequest(repo="r", out=tmp_path / "o"), "either --release"),
        (FuzzRequest(release="0.5.19", schedules=0), "--schedules"),
        (FuzzRequest(release="0.5.19", seed=-1), "--seed"),
        (FuzzRequest(release="0.5.19", transfer_backend="rdma"), "--transfer-backend"),
    ]
    for req, words in bad:
        with pytest.raises(ConfigError, match=words):
            check(req)
    check(FuzzRequest(release="0.5.19"))


def test_fuzz_cli_exits_2_on_an_unpinned_release(tmp_path) -> None:
    from difflab.cli import main

    out = tmp_path / "out"
    assert main(["fuzz", "--release", "9.9.9", "--out", str(out)]) == 2
    assert not out.exists()


def test_fuzz_chunks_cover_every_schedule_once() -> None:
    from difflab.workflows.fuzz import CHUNK, _chunks

    assert _chunks(1) == [1]
    assert _chunks(CHUNK) == [CHUNK]
    assert _chunks(2 * CHUNK + 3) == [CHUNK, CHUNK, 3]
    assert sum(_chunks(1234)) == 1234


def test_fuzz_keeps_each_distinct_leak_once_in_chunk_order() -> None:
    from difflab.workflows.fuzz import _leaks

    leak = {"schedule": ["a", "b"], "victim": "r1", "owner": "r0", "pages": [2], "canary": True, "decisions": []}
    other = {**leak, "owner": "r2"}
    events = [
        {"chunk": 0, "leak": leak},
        {"chunk": 1, "leak": None},
        {"chunk": 2, "leak": dict(leak)},
        {"chunk": 3, "leak": other},
    ]
    found = _leaks(events)
    assert [(f["chunk"], f["owner"]) for f in found] == [(0, "r0"), (3, "r2")]
