"""The matrix: which fixes to check, against which pinned sources, expecting what."""

from difflab.matrix.load import load_matrix
from difflab.matrix.model import (
    CommitPin,
    Family,
    Fix,
    Hunk,
    Matrix,
    Mutation,
    ProbeSpec,
    ReleasePin,
    SidePin,
    UpstreamTestFile,
)

__all__ = [
    "CommitPin",
    "Family",
    "Fix",
    "Hunk",
    "Matrix",
    "Mutation",
    "ProbeSpec",
    "ReleasePin",
    "SidePin",
    "UpstreamTestFile",
    "load_matrix",
]
