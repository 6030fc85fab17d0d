"""``difflab gpu``: the GPU/RDMA tier (live 1P1D deployments of base and head images).

Exit codes: 0 every verdict as expected; 1 some verdict failed; 2 bad input (e.g.
an image tag without a digest); 3 skipped: this host lacks a GPU prerequisite
(Docker engine, NVIDIA runtime, driver, GPU), named on stderr and in the JSON
status on stdout. ``--testserver`` runs the same scenarios against two in-process
SGLang-compatible servers (pre-fix behaviours on for base, off for head) and needs
no GPU: that is how the tier's logic is proven on a CPU.
"""

from __future__ import annotations

import argparse
import json

from difflab.commands import _args
from difflab.errors import ConfigError
from difflab.files.atomic import results_folder
from difflab.files.names import argument_path
from difflab.gpu.deployment import DEFAULT_MODEL
from difflab.gpu.images import ImageMap
from difflab.progress import Reporter
from difflab.report.record import RunRecord, is_run_folder, write_json

NAME = "gpu"
HELP = "run the GPU/RDMA tier: live prefill/decode deployments of base and head images, judged like probes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.fixes(parser, help="fix id or PR number (repeatable; default: every fix with a GPU plan)")
    parser.add_argument(
        "--image",
        action="append",
        dest="images",
        metavar="[KEY=]REF@sha256:DIGEST",
        help="a pinned image; KEY is base, head (one fix only) or a release such as 0.5.20; "
        "without KEY the tag must name the release (v0.5.20...)",
    )
    parser.add_argument(
        "--images",
        type=argument_path,
        dest="images_file",
        metavar="FILE",
        help='TOML file with an [images] table, e.g. "0.5.20" = "lmsysorg/sglang:v0.5.20@sha256:..."',
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model served by both sides (default: %(default)s)")
    _args.out(parser, "results/gpu-<timestamp>")
    parser.add_argument(
        "--rounds",
        type=int,
        help="throughput A/B rounds per side (0: skip; default 6 on GPUs, 3 with --testserver)",
    )
    parser.add_argument(
        "--hf-cache", type=argument_path, help="host Hugging Face cache to mount read-only (offline hosts)"
    )
    _args.matrix(parser)
    parser.add_argument(
        "--testserver",
        action="store_true",
        help="prove the tier without GPUs: two in-process test servers, pre-fix behaviours on (base) and off (head)",
    )


def main(args: argparse.Namespace) -> int:
    images = ImageMap({}) if args.testserver else ImageMap.from_args(args.images, args.images_file)
    if not args.testserver and not images.by_key:
        raise ConfigError(
            "no images: pass --image 0.5.20=lmsysorg/sglang:v0.5.20@sha256:<digest> (one per release "
            "the selected fixes need) or --images FILE; or --testserver to run without GPUs"
        )
    from difflab.workflows.gpu import TierRequest, run_tier  # the tier: imported only when it runs

    rounds = args.rounds if args.rounds is not None else (3 if args.testserver else 6)
    req = TierRequest(
        fixes=args.fixes,
        out=args.out,
        force=args.force,
        testserver=args.testserver,
        images=images,
        model=args.model,
        rounds=rounds,
        matrix=args.matrix,
        hf_cache=args.hf_cache,
    )
    out = Reporter()
    outcome = run_tier(req, out)
    if outcome.status == "skipped":
        out.warn(f"difflab gpu: {outcome.reason}")
        if args.out is not None:  # CI keeps the reason with the artifacts, under the same --out rules
            with results_folder(args.out, force=args.force, ours=is_run_folder) as work:
                write_json(work / "status.json", outcome.to_dict())
                RunRecord(command="gpu", fixes=list(args.fixes or [])).write(work, outcome.exit_code)
    else:
        for v in outcome.verdicts:
            out.warn(f"  {v.id:<18} {v.verdict:<15} {v.reason[:140]}")
        out.warn(f"results: {outcome.out_dir}")
    out.print(json.dumps(outcome.to_dict(), indent=2))
    return outcome.exit_code
