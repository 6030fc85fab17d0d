"""``difflab pack RUN_DIR``: a byte-for-byte reproducible .tar.gz of a sealed run folder."""

from __future__ import annotations

import argparse

from difflab.bundle import checksums
from difflab.bundle.pack import pack
from difflab.files.names import argument_path
from difflab.progress import Reporter

NAME = "pack"
HELP = "Pack a sealed run folder into a deterministic .tar.gz (default: RUN_DIR.tar.gz beside it)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=argument_path, metavar="RUN_DIR", help="sealed run folder")
    parser.add_argument("-o", "--output", type=argument_path, metavar="FILE", help="archive to write")


def main(args: argparse.Namespace) -> int:
    out = pack(args.run_dir, args.output)
    Reporter().print(f"{out}  sha256 {checksums.sha256_file(out)}")
    return 0
