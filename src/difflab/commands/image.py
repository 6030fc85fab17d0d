"""``difflab image``: build, show or verify the Docker image the docker back end runs probes in.

``build`` assembles the root filesystem from the shared environment and ``docker import``s
it (no image registry needed); it is a no-op when the engine already has an image labelled
with the environment's digest, unless ``--rebuild``. ``difflab run --backend docker`` does
the same on first use, so this command only moves the ~1.5 min build to a moment you choose.
"""

from __future__ import annotations

import argparse
import json

from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.files.names import argument_path
from difflab.image.build import ensure_image, verify_image
from difflab.image.catalog import find_image, resolve_image, tag_for
from difflab.image.client import connect
from difflab.progress import Reporter

NAME = "image"
HELP = "build (without a registry), show or verify the Docker image of the shared environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["build", "show", "verify"],
        nargs="?",
        default="build",
        help="build: ensure the image exists (default); show: print it; verify: smoke-test it",
    )
    parser.add_argument("--docker-host", help="engine address (default: $DOCKER_HOST, else the default socket)")
    parser.add_argument("--rebuild", action="store_true", help="build even if an image for this environment exists")
    parser.add_argument(
        "--tar",
        type=argument_path,
        metavar="FILE",
        help="also keep the root filesystem tarball here (default: streamed, not kept)",
    )
    parser.add_argument("--image", help="show/verify this image instead of the environment's")


def main(args: argparse.Namespace) -> int:
    out = Reporter()
    client = connect(args.docker_host)
    env = SharedEnvironment()
    if args.action == "build":
        report = ensure_image(client, env, say=out.say, rebuild=args.rebuild, tar_path=args.tar)
        if not report.built:
            out.say(f"reusing {report.image.pinned} (labelled for environment {env.digest[:16]})")
        out.print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        return 0
    image = resolve_image(client, args.image) if args.image else find_image(client, env.digest)
    if image is None:
        raise EnvironmentSetupError(
            f"no image for environment {env.digest[:16]} (expected {tag_for(env.digest)}); run `difflab image build`"
        )
    if args.action == "verify":
        result = verify_image(client, image, env if env.ready else None)
        out.print(json.dumps({"image": image.pinned, "smoke": result}, indent=2, sort_keys=True))
        return 0
    out.print(json.dumps({**image.describe(), "labels": image.labels}, indent=2, sort_keys=True))
    return 0
