"""The self-check's mutated copy edits one file of a copy of the source, and only a file inside it.

The matrix loader refuses absolute and escaping mutation paths; ``mutated_copy`` checks again after links
are resolved, so a path that slipped through (a matrix built in code, a link inside the source) can never
make it read or rewrite a file outside the copied ``sglang/`` tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.matrix.model import Mutation
from difflab.source.base import MaterialisedSource
from difflab.workflows.selfcheck import StaleMutation, mutated_copy

PREFILL = "sglang/srt/disaggregation/prefill.py"
CODE = "def add(req):\n    if is_unadmitted_reject(req):\n        return retire(req)\n    queue(req)\n"


def source(tmp_path: Path) -> MaterialisedSource:
    root = tmp_path / "src" / "0.5.21"
    (root / PREFILL).parent.mkdir(parents=True)
    (root / PREFILL).write_text(CODE)
    (root / "sglang" / "__init__.py").write_text("")
    return MaterialisedSource(
        label="0.5.21", kind="release", root=root, identity={"version": "0.5.21"}, digest="d" * 16
    )


def mutation(file: str, find: str = "if is_unadmitted_reject(req):") -> Mutation:
    return Mutation(name="drop-guard", file=file, find=find, replace="if False:", targets=("p",))


def test_the_mutated_copy_edits_only_its_copy(tmp_path: Path) -> None:
    src = source(tmp_path)
    copy = mutated_copy(src, mutation(PREFILL), cache=tmp_path / "cache")
    assert (copy.root / PREFILL).read_text() == CODE.replace("if is_unadmitted_reject(req):", "if False:")
    assert (src.root / PREFILL).read_text() == CODE  # the pristine cache is untouched
    assert copy.label == "0.5.21+drop-guard" and copy.kind == "mutated"
    assert copy.identity == {"version": "0.5.21", "mutation": "drop-guard", "mutated_file": PREFILL}
    assert copy.root.parent == tmp_path / "cache" / "mutated"


@pytest.mark.parametrize("file", ["/etc/hosts", "sglang/../../outside.py", "../outside.py", "setup.py"])
def test_a_path_outside_the_sglang_tree_is_refused(tmp_path: Path, file: str) -> None:
    src = source(tmp_path)
    outside = tmp_path / "src" / "outside.py"
    outside.write_text(CODE)
    (src.root / "setup.py").write_text(CODE)
    with pytest.raises(ConfigError) as err:
        mutated_copy(src, mutation(file), cache=tmp_path / "cache")
    assert str(err.value) == (f"mutation 'drop-guard': file {file!r} is not inside the source's sglang/ tree; refused")
    assert outside.read_text() == CODE and (src.root / "setup.py").read_text() == CODE
    assert not (tmp_path / "cache").exists()


def test_a_link_out_of_the_source_is_refused(tmp_path: Path) -> None:
    src = source(tmp_path)
    victim = tmp_path / "host.py"
    victim.write_text(CODE)
    (src.root / "sglang" / "srt" / "linked.py").symlink_to(victim)
    with pytest.raises(ConfigError, match="is not inside the source's sglang/ tree"):
        mutated_copy(src, mutation("sglang/srt/linked.py"), cache=tmp_path / "cache")
    assert victim.read_text() == CODE


def test_stale_mutations_are_outcomes_not_errors(tmp_path: Path) -> None:
    src = source(tmp_path)
    with pytest.raises(StaleMutation, match="sglang/srt/gone.py does not exist in 0.5.21"):
        mutated_copy(src, mutation("sglang/srt/gone.py"), cache=tmp_path / "cache")
    with pytest.raises(StaleMutation, match="expected text not found in"):
        mutated_copy(src, mutation(PREFILL, find="if never_there:"), cache=tmp_path / "cache")
    with pytest.raises(StaleMutation, match="found 4 times \\(must be unique\\)"):
        mutated_copy(src, mutation(PREFILL, find="(req)"), cache=tmp_path / "cache")
