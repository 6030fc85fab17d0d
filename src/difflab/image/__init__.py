"""The Docker image the docker back end runs probes in, built from the shared environment without a registry.

One job per module: ``catalog`` finds images (labels, digests), ``rootfs`` plans the root
filesystem, ``tarball`` streams it as a hashed tar, ``build`` imports it into the engine,
``smoke`` proves it imports what the host environment imports, ``client`` connects to the
engine. ``difflab image`` and :class:`~difflab.runner.docker.DockerRunner` use it.
"""
