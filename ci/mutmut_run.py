"""``mutmut``, with the probe harness named the way the probes import it, and mutants a probe process
can import.

Named: a probe runs with ``probes/`` on its ``sys.path`` and imports ``harness.construction``, so that is the
``__module__`` of every function in it. mutmut names a mutant by its file's path (only a leading
``src/`` is dropped): ``probes.harness.construction.x_...``. Its trampoline calls a mutant only when the
two names agree, so without this every harness mutant would run the original code and read as
"no tests". This drops the leading ``probes/`` too.

Importable: a mutated module starts by importing mutmut's trampoline. A probe process runs in the
shared SGLang environment, with only the lab's staged ``difflab.probe`` and the probes on its path
(:mod:`difflab.runner.box`), so a mutated ``difflab/probe/kit.py`` or harness module would fail there
with ``No module named 'mutmut'`` -- and every test that runs a probe would fail with it, whatever the
mutant. Where mutmut is missing, the header below leaves each function as written: the original code,
which is what mutmut's own trampoline runs there anyway (the probe's environment is built from an
allow-list, so no mutant is ever named in it). Nothing else changes; the arguments are ``mutmut``'s
own (``python ci/mutmut_run.py run "harness.construction.*"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import libcst
import mutmut.__main__ as main
import mutmut.mutation.file_mutation as file_mutation
import mutmut.utils.format_utils as format_utils

IMPORT_ROOTS = ("probes",)
"""Folders whose children are imported as top-level names (a probe's ``sys.path`` holds them)."""

_path_name = format_utils.get_mutant_name


def mutant_name(relative_source_path: Path, mutant_method_name: str) -> str:
    path = Path(relative_source_path)
    if len(path.parts) > 1 and path.parts[0] in IMPORT_ROOTS:
        path = Path(*path.parts[1:])
    return _path_name(path, mutant_method_name)


HEADER = """
try:
    from mutmut.mutation.trampoline import wrap_in_trampoline as _mutmut_mutated, MutantDict
except ModuleNotFoundError:  # a probe process: no mutmut, and no mutant named either
    MutantDict = dict

    def _mutmut_mutated(mutants_dict, is_classmethod=False):
        return lambda func: func
"""
"""What heads every mutated module, in place of mutmut's bare import of its trampoline."""

for _module in (format_utils, file_mutation, main):
    _module.get_mutant_name = mutant_name  # each imported the function by name
_header = list(libcst.parse_module(HEADER).body)
file_mutation.trampoline_impl_cst = [*_header[:-1], _header[-1].with_changes(leading_lines=[libcst.EmptyLine()] * 2)]

if __name__ == "__main__":
    sys.argv[0] = "mutmut"
    sys.exit(main.cli())
