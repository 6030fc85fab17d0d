"""Which packages ship, and from which folders (the rest of the build is declared in pyproject.toml).

The probes and the matrices stay where the checkout keeps them, top-level ``probes/`` and
``matrices/``, and ship as the subpackages ``difflab.probes`` and ``difflab.matrices``; every
subfolder is found at build time, so a new probe, harness module or matrix ships without an
edit here. An editable install maps the same names onto the same folders (edits are live).
"""

from setuptools import find_namespace_packages, find_packages, setup

SHIPPED = {"difflab.probes": "probes", "difflab.matrices": "matrices"}


def shipped(package: str, folder: str) -> list[str]:
    """``package`` and one subpackage per subfolder of ``folder`` (``probes/harness`` -> ``difflab.probes.harness``)."""
    found = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
    return [package, *(f"{package}.{name}" for name in found)]


setup(
    packages=[*find_packages("src"), *(p for package, folder in SHIPPED.items() for p in shipped(package, folder))],
    package_dir={"": "src", **SHIPPED},
)
