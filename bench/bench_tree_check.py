"""Benchmark: what checking a cached release tree before use costs. A script, not a test.

    .venv/bin/python bench/bench_tree_check.py [--release 0.5.23] [--repeat 5]

The tree is unpacked from the cached, hash-pinned wheel (the release source's own unpacker)
into a scratch folder, so the shared cache is never touched. Then, side by side:

- ``first check``: the first check after an unpack, where every file is racy (made read-only
  after it was hashed) and so hashed once more;
- ``warm check``: every later check of an unchanged tree (``lstat`` of every file, one digest);
- ``hash every file``: what checking by content at every use would cost.

Times are medians of ``--repeat`` runs; the ratios say how much hashing every file at every
use would add to each release a run materialises.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from difflab.matrix import load_matrix
from difflab.paths import cache_root, default_matrix
from difflab.source import tree
from difflab.source.release import unpack_sglang


def _median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default=None, help="a release the default matrix pins (default: the newest)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    releases = load_matrix(default_matrix()).releases
    version = args.release or sorted(releases)[-1]
    pin = releases[version]
    wheel = cache_root() / "wheels" / pin.file
    if not wheel.is_file():
        print(f"{wheel}: not in the cache; run `difflab contains` once to download it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-tree-") as scratch:
        root = Path(scratch) / version
        unpack_sglang(wheel, root, pin.sha256)
        start = time.perf_counter()
        first = tree.check(root, pin.sha256)
        first_s = time.perf_counter() - start
        assert first is not None and first.intact, first
        warm_s = _median_s(lambda: tree.check(root, pin.sha256), args.repeat)
        expected = tree.read_listing(root, first.digest)
        assert expected is not None
        full_s = _median_s(lambda: tree.compare(root, expected), args.repeat)
        files = len(expected)
        print(f"release {version}: {files} files, median of {args.repeat}")
        print(f"{'first check':>16}  {'warm check':>10}  {'hash every file':>15}  {'hash / warm':>11}")
        print(
            f"{first_s * 1e3:>13.1f} ms  {warm_s * 1e3:>7.1f} ms  {full_s * 1e3:>12.1f} ms  {full_s / warm_s:>10.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
