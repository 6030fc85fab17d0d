"""The matrix: which fixes to check, against which pinned sources, expecting what."""

from difflab.matrix.load import load_matrix
from difflab.matrix.model import (
    CommitPin,
    Fix,
    Hunk,
    Matrix,
    Mutation,
    ProbeSpec,
    ReleasePin,
    SidePin,
)

__all__ = ["CommitPin", "Fix", "Hunk", "Matrix", "Mutation", "ProbeSpec", "ReleasePin", "SidePin", "load_matrix"]
