"""Every matrix validation rule: a schema-2 sample loads as written, and each broken rule is refused with the
exact message (file, fix, field). One edit per case, so a rule that is dropped or weakened fails its own case."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.matrix.gpu import GpuPlan, load_gpu_plans
from difflab.matrix.model import CommitPin, Fix, Hunk, Mutation, ProbeSpec, ReleasePin, SidePin, UpstreamTestFile

SAMPLE = """\
schema = 2
[releases."0.5.20"]
file = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c"
[releases."0.5.21"]
file = "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20"

[[fixes]]
id = "38935"
pr = 38935
part = "a"
title = "Do not admit intake-rejected requests"
note = "door checks"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
commits.base = { sha = "17ba2c2e", confirmed = false }
commits.head = { sha = "8f3d6944b76c428d884582cb6c82a39db1465360", confirmed = true }
upstream_tests = ["test/registered/unit/disaggregation/test_admission_abort_not_enqueued.py"]

[[fixes.probes]]
name = "pr38935_prefill_door"
[fixes.probes.expect]
"rejected.enqueued" = [true, false]
"rejected.final_retired" = [false, true]
[fixes.probes.controls]
"valid.enqueued" = true
"valid.retired" = false
[fixes.probes.channels]
"rejected.final_retired" = "valid.retired"

[[fixes.probes]]
name = "pr38935_decode_door"
[fixes.probes.expect]
"rejected.pending" = [true, false]
[fixes.probes.controls]
"valid.pending" = true

[[fixes.hunks]]
id = "prefill-door"
file = "sglang/srt/disaggregation/prefill.py"
function = "PrefillBootstrapQueue.add"
change = "a rejected request is retired at the door"
fields = { pr38935_prefill_door = ["rejected.enqueued", "rejected.final_retired"] }

[[fixes.hunks]]
id = "decode-door"
file = "sglang/srt/disaggregation/decode.py"
function = "DecodePreallocQueue.add"
change = "a rejected request is retired at the decode door"
fields = { pr38935_decode_door = ["rejected.pending"] }

[[fixes.mutations]]
name = "drop-prefill-door-guard"
file = "sglang/srt/disaggregation/prefill.py"
find = "if is_unadmitted_reject(req):"
replace = "if False:"
hunks = ["prefill-door"]

[[fixes.mutations]]
name = "drop-decode-door-guard"
file = "sglang/srt/disaggregation/decode.py"
find = "and is_unadmitted_reject(req):"
replace = ""
hunks = ["decode-door"]
targets = ["pr38935_decode_door", "pr38935_prefill_door"]

[[fixes]]
id = "43719b"
pr = 43719
title = "Quarantine the failed room"
base = { release = "0.5.21" }
head = { unavailable = "no release carries it" }
[[fixes.probes]]
name = "pr43719_failed_room_quarantine"
expect = { "failed.quarantined" = [false, true] }
controls = { "ok.quarantined" = false }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    return message.removeprefix(f"{path}: ")


def edit(old: str, new: str, count: int = 1) -> str:
    assert SAMPLE.count(old) >= count, old
    return SAMPLE.replace(old, new, count)


def test_the_sample_loads_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, SAMPLE)
    m = load_matrix(path)
    assert m.path == path and m.sha256 == hashlib.sha256(SAMPLE.encode()).hexdigest()
    assert m.releases == {
        "0.5.20": ReleasePin(
            "0.5.20",
            "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
            "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c",
        ),
        "0.5.21": ReleasePin(
            "0.5.21",
            "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl",
            "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20",
        ),
    }
    door, room = m.fixes
    prefill = ProbeSpec(
        "pr38935_prefill_door",
        {"rejected.enqueued": (True, False), "rejected.final_retired": (False, True)},
        {"valid.enqueued": True, "valid.retired": False},
        {"rejected.final_retired": "valid.retired"},
    )
    decode = ProbeSpec("pr38935_decode_door", {"rejected.pending": (True, False)}, {"valid.pending": True}, {})
    assert door == Fix(
        id="38935",
        pr=38935,
        title="Do not admit intake-rejected requests",
        part="a",
        note="door checks",
        base=SidePin(release="0.5.20"),
        head=SidePin(release="0.5.21"),
        commits={
            "base": CommitPin("17ba2c2e", False),
            "head": CommitPin("8f3d6944b76c428d884582cb6c82a39db1465360", True),
        },
        upstream_tests=(UpstreamTestFile("test/registered/unit/disaggregation/test_admission_abort_not_enqueued.py"),),
        probes=(prefill, decode),
        hunks=(
            Hunk(
                "prefill-door",
                "sglang/srt/disaggregation/prefill.py",
                "PrefillBootstrapQueue.add",
                "a rejected request is retired at the door",
                {"pr38935_prefill_door": ("rejected.enqueued", "rejected.final_retired")},
            ),
            Hunk(
                "decode-door",
                "sglang/srt/disaggregation/decode.py",
                "DecodePreallocQueue.add",
                "a rejected request is retired at the decode door",
                {"pr38935_decode_door": ("rejected.pending",)},
            ),
        ),
        mutations=(
            Mutation(
                "drop-prefill-door-guard",
                "sglang/srt/disaggregation/prefill.py",
                "if is_unadmitted_reject(req):",
                "if False:",
                ("pr38935_prefill_door",),  # targets default to the probes observing the reverted hunks
                ("prefill-door",),
            ),
            Mutation(
                "drop-decode-door-guard",
                "sglang/srt/disaggregation/decode.py",
                "and is_unadmitted_reject(req):",
                "",
                ("pr38935_decode_door", "pr38935_prefill_door"),
                ("decode-door",),
            ),
        ),
    )
    assert room.head == SidePin(unavailable="no release carries it") and room.part is None and room.note is None
    assert (room.commits, room.upstream_tests, room.hunks, room.mutations) == ({}, (), (), ())


def test_labels_and_selection(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, SAMPLE))
    door, room = m.fixes
    assert (door.label, room.label) == ("#38935(a)", "#43719")
    assert [door.base.label, door.head.label, room.head.label] == ["0.5.20", "0.5.21", "unavailable"]
    assert SidePin(commit="8f3d6944b76c428d884582cb6c82a39db1465360").label == "8f3d6944b76c"
    assert door.hunk("decode-door").observed() == [("pr38935_decode_door", "rejected.pending")]
    assert door.hunk("prefill-door").observed() == [
        ("pr38935_prefill_door", "rejected.enqueued"),
        ("pr38935_prefill_door", "rejected.final_retired"),
    ]
    assert m.select(None) == m.select([]) == [door, room]
    assert m.select(["43719b"]) == m.select(["#43719"]) == m.select(["43719"]) == [room]
    assert m.select(["43719", "38935", "#43719"]) == [room, door]
    assert m.fix("38935") is door
    with pytest.raises(ConfigError) as err:
        m.select(["38935", "41404"])
    assert str(err.value) == f"{m.path}: unknown fix '41404' (known: 38935, 43719b)"


ROOM = '[[fixes]]\nid = "43719b"'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # -- the file and its top level
        (SAMPLE.replace("schema = 2", ""), "schema: expected schema = 2 (or 1 for an older matrix), got None"),
        (edit("schema = 2", "schema = 7"), "schema: expected schema = 2 (or 1 for an older matrix), got 7"),
        (edit("schema = 2", "schema = true"), "schema: expected schema = 2 (or 1 for an older matrix), got True"),
        (edit("schema = 2", 'schema = 2\nowner = "me"'), "top level: unknown field(s) ['owner']"),
        ('schema = 2\nreleases = "all"\n' + SAMPLE[SAMPLE.index("[[fixes]]") :], "releases: expected a table, got str"),
        (SAMPLE[: SAMPLE.index("[[fixes]]")], "fixes: expected at least one [[fixes]] entry"),
        (
            edit("schema = 2\n", "schema = 2\nfixes = []\n").split("[[fixes]]")[0],
            "fixes: expected at least one [[fixes]] entry",
        ),
        (
            edit("schema = 2\n", 'schema = 2\nfixes = "38935"\n').split("[[fixes]]")[0],
            "fixes: expected at least one [[fixes]] entry",
        ),
        (
            edit("schema = 2\n", "schema = 2\nfixes = [1]\n").split("[[fixes]]")[0],
            "fixes[0]: expected a table, got int",
        ),
        (SAMPLE + SAMPLE[SAMPLE.index(ROOM) :], "fixes: duplicate fix id(s) ['43719b']"),
        # -- releases
        (
            edit('[releases."0.5.20"]\n', '[releases."0.5.20"]\nurl = "https://example.com"\n'),
            "releases.'0.5.20': unknown field(s) ['url']",
        ),
        (
            edit('file = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"\n', ""),
            "releases.'0.5.20'.file: expected a non-empty string",
        ),
        (
            edit('file = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"', 'file = "sglang-0.5.20.tar.gz"'),
            "releases.'0.5.20'.file: expected the sglang wheel of version 0.5.20 (sglang-0.5.20-...whl)",
        ),
        (
            edit(
                'file = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"',
                'file = "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl"',
            ),
            "releases.'0.5.20'.file: expected the sglang wheel of version 0.5.20 (sglang-0.5.20-...whl)",
        ),
        (
            edit('sha256 = "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c"\n', ""),
            "releases.'0.5.20'.sha256: expected a non-empty string",
        ),
        (edit('sha256 = "1573', 'sha256 = "A573'), "releases.'0.5.20'.sha256: expected 64 lowercase hex digits"),
        (edit('sha256 = "1573', 'sha256 = "573'), "releases.'0.5.20'.sha256: expected 64 lowercase hex digits"),
        (edit('sha256 = "1573', 'sha256 = "01573'), "releases.'0.5.20'.sha256: expected 64 lowercase hex digits"),
        (
            edit('8513c"\n[releases', '8513c\\n"\n[releases'),
            "releases.'0.5.20'.sha256: expected 64 lowercase hex digits",
        ),
        (edit("schema = 2\n", 'schema = 2\nreleases."0.5.22" = 1\n'), "releases.'0.5.22': expected a table, got int"),
        # -- a fix's own fields
        (edit('id = "38935"\n', ""), "fixes[0].id: expected a non-empty string"),
        (edit('id = "38935"', 'id = "  "'), "fix '  '.id: expected a non-empty string"),
        (edit('id = "38935"', "id = 38935"), "fixes[0].id: expected a non-empty string"),
        (
            edit(
                'title = "Do not admit intake-rejected requests"\n',
                'title = "Do not admit intake-rejected requests"\nowner = "x"\n',
            ),
            "fix '38935': unknown field(s) ['owner']",
        ),
        (edit("pr = 38935", "pr = 0"), "fix '38935'.pr: expected a positive pull-request number"),
        (edit("pr = 38935", "pr = -38935"), "fix '38935'.pr: expected a positive pull-request number"),
        (edit("pr = 38935", "pr = true"), "fix '38935'.pr: expected a positive pull-request number"),
        (edit("pr = 38935", 'pr = "38935"'), "fix '38935'.pr: expected a positive pull-request number"),
        (edit("pr = 38935", "pr = 38935.0"), "fix '38935'.pr: expected a positive pull-request number"),
        (edit("pr = 38935\n", ""), "fix '38935'.pr: expected a positive pull-request number"),
        (
            edit('title = "Do not admit intake-rejected requests"\n', ""),
            "fix '38935'.title: expected a non-empty string",
        ),
        (edit('part = "a"', "part = 1"), "fix '38935'.part: expected a non-empty string"),
        (edit('note = "door checks"', 'note = ""'), "fix '38935'.note: expected a non-empty string"),
        (edit('base = { release = "0.5.20" }\n', ""), "fix '38935'.base: missing"),
        (edit('head = { release = "0.5.21" }\n', ""), "fix '38935'.head: missing"),
        # -- sides
        (edit('base = { release = "0.5.20" }', 'base = "0.5.20"'), "fix '38935'.base: expected a table, got str"),
        (
            edit('head = { release = "0.5.21" }', 'head = { release = "0.5.21", tag = "v1" }'),
            "fix '38935'.head: unknown field(s) ['tag']",
        ),
        (
            edit('head = { release = "0.5.21" }', "head = {}"),
            "fix '38935'.head: give exactly one of release, commit or unavailable",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { release = "0.5.21", commit = "8f3d6944" }'),
            "fix '38935'.head: give exactly one of release, commit or unavailable",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { release = "0.5.21", unavailable = "no" }'),
            "fix '38935'.head: give exactly one of release, commit or unavailable",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { release = "9.9.9" }'),
            "fix '38935'.head.release: release '9.9.9' is not pinned under [releases]",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { unavailable = "" }'),
            "fix '38935'.head.unavailable: expected a non-empty string",
        ),
        (
            edit('base = { release = "0.5.20" }', 'base = { unavailable = "older than every pin" }'),
            "fix '38935'.commits.base: the base is declared unavailable: give its commit as base, or neither",
        ),
        (
            edit('base = { release = "0.5.20" }', 'base = { unavailable = "older" }').replace(
                'head = { release = "0.5.21" }', 'head = { unavailable = "in no release" }'
            ),
            "fix '38935'.base: base and head are both unavailable: at least one side needs a release or commit",
        ),
        (
            edit('base = { release = "0.5.20" }', 'base = { unavailable = "" }'),
            "fix '38935'.base.unavailable: expected a non-empty string",
        ),
        (edit('head = { release = "0.5.21" }', 'head = { commit = "8f3d694" }'), None),
        (edit('head = { release = "0.5.21" }', 'head = { commit = "8f3d6944b76c428d884582cb6c82a39db1465360" }'), None),
        (
            edit('head = { release = "0.5.21" }', 'head = { commit = "8f3d69" }'),
            "fix '38935'.head.commit: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { commit = "8f3d6944b76c428d884582cb6c82a39db14653600" }'),
            "fix '38935'.head.commit: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { commit = "8F3D6944" }'),
            "fix '38935'.head.commit: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { commit = "v0.5.21" }'),
            "fix '38935'.head.commit: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('head = { release = "0.5.21" }', 'head = { commit = "8f3d6944\\n" }'),
            "fix '38935'.head.commit: expected a hex git SHA (7-40 digits)",
        ),
        # -- commits quoted in public material
        (
            edit(
                'commits.base = { sha = "17ba2c2e", confirmed = false }',
                'commits.old = { sha = "17ba2c2e", confirmed = false }',
            ),
            "fix '38935'.commits: unknown side 'old'",
        ),
        (
            edit('sha = "17ba2c2e"', 'sha = "17ba2c"'),
            "fix '38935'.commits.base.sha: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('sha = "17ba2c2e"', 'sha = "17BA2C2E"'),
            "fix '38935'.commits.base.sha: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('sha = "17ba2c2e"', 'sha = "17ba2c2g"'),
            "fix '38935'.commits.base.sha: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit(
                'sha = "8f3d6944b76c428d884582cb6c82a39db1465360"', 'sha = "8f3d6944b76c428d884582cb6c82a39db14653601"'
            ),
            "fix '38935'.commits.head.sha: expected a hex git SHA (7-40 digits)",
        ),
        (
            edit('{ sha = "17ba2c2e", confirmed = false }', "{ confirmed = false }"),
            "fix '38935'.commits.base.sha: expected a non-empty string",
        ),
        (edit("confirmed = false", 'confirmed = "no"'), "fix '38935'.commits.base.confirmed: expected true or false"),
        (edit("confirmed = false", "confirmed = 0"), "fix '38935'.commits.base.confirmed: expected true or false"),
        (
            edit('{ sha = "17ba2c2e", confirmed = false }', '"17ba2c2e"'),
            "fix '38935'.commits.base: expected a table, got str",
        ),
        (
            edit('commits.base = { sha = "17ba2c2e", confirmed = false }\ncommits.head', 'commits = "x"\n#'),
            "fix '38935'.commits: expected a table, got str",
        ),
        # -- upstream tests
        (
            edit('upstream_tests = ["test/', 'upstream_tests = [1, "test/'),
            "fix '38935'.upstream_tests[0]: expected a path or a table with file and own, got int",
        ),
        (
            edit(
                'upstream_tests = ["test/registered/unit/disaggregation/test_admission_abort_not_enqueued.py"]',
                'upstream_tests = "test/x.py"',
            ),
            "fix '38935'.upstream_tests: expected a list of test files (paths, or tables with file and own)",
        ),
    ],
)
def test_fix_and_file_rules(tmp_path: Path, text: str, message: str | None) -> None:
    if message is None:
        return  # a replacement that must stay valid; loads below
    assert refused(tmp_path, text) == message


def test_a_base_older_than_every_pin_loads_with_its_reason(tmp_path: Path) -> None:
    """A fix the oldest pinned release already carries: base unavailable with the reason, head a release."""
    text = edit('base = { release = "0.5.20" }', 'base = { unavailable = "0.5.19 already carries it" }')
    text = text.replace('commits.base = { sha = "17ba2c2e", confirmed = false }\n', "")
    fix = next(f for f in load_matrix(write(tmp_path, text)).fixes if f.id == "38935")
    assert (fix.base.unavailable, fix.base.label, fix.head.release) == (
        "0.5.19 already carries it",
        "unavailable",
        "0.5.21",
    )


def test_valid_variants_load(tmp_path: Path) -> None:
    assert load_matrix(write(tmp_path, edit("pr = 38935", "pr = 1"))).fixes[0].pr == 1
    for head in ('{ commit = "8f3d694" }', '{ commit = "8f3d6944b76c428d884582cb6c82a39db1465360" }'):
        m = load_matrix(write(tmp_path, edit('head = { release = "0.5.21" }', f"head = {head}")))
        assert m.fixes[0].head.commit == head.split('"')[1]
    m = load_matrix(write(tmp_path, SAMPLE.replace("schema = 2", "schema = 1")))
    assert m.fixes[0].probes[0].channels == {}  # schema 1: no measurement channels


def probe0(old: str, new: str) -> str:
    """Edit inside the first probe table only."""
    start = SAMPLE.index('name = "pr38935_prefill_door"')
    end = SAMPLE.index("[[fixes.probes]]", start)
    block = SAMPLE[start:end]
    assert old in block, old
    return SAMPLE[:start] + block.replace(old, new, 1) + SAMPLE[end:]


P0 = "fix '38935'.probes[0]"
EXPECT0 = '[fixes.probes.expect]\n"rejected.enqueued" = [true, false]\n"rejected.final_retired" = [false, true]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            edit(
                '[[fixes.probes]]\nname = "pr38935_prefill_door"',
                '[[fixes.probes]]\nname = "pr38935_prefill_door"\nowner = 1',
            ),
            f"{P0}: unknown field(s) ['owner']",
        ),
        (probe0('name = "pr38935_prefill_door"\n', ""), f"{P0}.name: expected a non-empty string"),
        (
            probe0('name = "pr38935_prefill_door"', 'name = "pr38935-prefill"'),
            f"{P0}.name: 'pr38935-prefill' is not a probe module name",
        ),
        (
            probe0('name = "pr38935_prefill_door"', 'name = "38935_prefill"'),
            f"{P0}.name: '38935_prefill' is not a probe module name",
        ),
        (
            probe0('name = "pr38935_prefill_door"', 'name = "pr38935_prefill_door\\n"'),
            f"{P0}.name: 'pr38935_prefill_door\\n' is not a probe module name",
        ),
        (
            probe0('name = "pr38935_prefill_door"', 'name = "pr38935_prefill_door.py"'),
            f"{P0}.name: 'pr38935_prefill_door.py' is not a probe module name",
        ),
        # a probe with no expect
        (
            probe0(
                EXPECT0,
                "",
            )
            .replace('"rejected.final_retired" = "valid.retired"\n', "")
            .replace(
                'fields = { pr38935_prefill_door = ["rejected.enqueued", "rejected.final_retired"] }',
                'fields = { pr38935_decode_door = ["rejected.pending"] }',
            ),
            f"{P0}.expect: a probe must declare at least one field the fix changes",
        ),
        (
            probe0(
                EXPECT0,
                "[fixes.probes.expect]\n",
            ),
            f"{P0}.expect: a probe must declare at least one field the fix changes",
        ),
        (
            probe0(
                'name = "pr38935_prefill_door"\n', 'name = "pr38935_prefill_door"\nexpect = "rejected.enqueued"\n'
            ).replace(EXPECT0, "", 1),
            f"{P0}.expect: expected a table, got str",
        ),
        (
            probe0('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = [true]'),
            f"{P0}.expect.'rejected.enqueued': expected [base_value, head_value]",
        ),
        (
            probe0('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = [true, false, true]'),
            f"{P0}.expect.'rejected.enqueued': expected [base_value, head_value]",
        ),
        (
            probe0('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = true'),
            f"{P0}.expect.'rejected.enqueued': expected [base_value, head_value]",
        ),
        (
            probe0('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = [false, false]'),
            f"{P0}.expect.'rejected.enqueued': base and head values are equal: that is a control",
        ),
        (
            probe0(
                'name = "pr38935_prefill_door"\n', 'name = "pr38935_prefill_door"\ncontrols = ["valid.enqueued"]\n'
            ).replace('[fixes.probes.controls]\n"valid.enqueued" = true\n"valid.retired" = false\n', "", 1),
            f"{P0}.controls: expected a table, got list",
        ),
        # a field both expected and controlled
        (
            probe0('"valid.enqueued" = true', '"valid.enqueued" = true\n"rejected.enqueued" = true'),
            f"{P0}: field(s) ['rejected.enqueued'] are both expected to change and controls",
        ),
        # measurement channels
        (
            probe0('"valid.enqueued" = true\n', ""),
            f"{P0}.expect.'rejected.enqueued': no control measures 'enqueued': "
            "add a control scenario's '<scenario>.enqueued' (or map the field in channels)",
        ),
        (
            probe0('"rejected.final_retired" = "valid.retired"\n', ""),
            f"{P0}.expect.'rejected.final_retired': no control measures 'final_retired': "
            "add a control scenario's '<scenario>.final_retired' (or map the field in channels)",
        ),
        (
            probe0('"rejected.final_retired" = "valid.retired"', '"rejected.final_retired" = "valid.pending"'),
            f"{P0}.channels.'rejected.final_retired': 'valid.pending' is not a control of this probe",
        ),
        (
            probe0('"rejected.final_retired" = "valid.retired"', '"rejected.final_retired" = 1'),
            f"{P0}.channels.'rejected.final_retired': 1 is not a control of this probe",
        ),
        (
            probe0(
                '"rejected.final_retired" = "valid.retired"',
                '"rejected.final_retired" = "valid.retired"\n"valid.enqueued" = "valid.retired"',
            ),
            f"{P0}.channels.'valid.enqueued': not an expect field of this probe",
        ),
        (
            probe0(
                'name = "pr38935_prefill_door"\n', 'name = "pr38935_prefill_door"\nchannels = "valid.retired"\n'
            ).replace('[fixes.probes.channels]\n"rejected.final_retired" = "valid.retired"\n', "", 1),
            f"{P0}.channels: expected a table, got str",
        ),
        # a probe listed twice
        (
            edit('name = "pr38935_decode_door"', 'name = "pr38935_prefill_door"'),
            "fix '38935'.probes: a probe is listed twice",
        ),
    ],
)
def test_probe_rules(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def test_a_probe_field_without_a_scenario_is_its_own_channel(tmp_path: Path) -> None:
    text = probe0('"rejected.enqueued" = [true, false]', '"freed" = [0, 1]')
    text = text.replace(
        'fields = { pr38935_prefill_door = ["rejected.enqueued",', 'fields = { pr38935_prefill_door = ["freed",'
    )
    assert refused(tmp_path, text) == (
        f"{P0}.expect.'freed': no control measures 'freed': add a control scenario's '<scenario>.freed' "
        "(or map the field in channels)"
    )
    text = text.replace('"valid.enqueued" = true', '"valid.enqueued" = true\n"freed_ok" = 1\n"ok.freed" = 1')
    assert load_matrix(write(tmp_path, text)).fixes[0].probes[0].controls["ok.freed"] == 1


def hunk0(old: str, new: str) -> str:
    start = SAMPLE.index('id = "prefill-door"')
    end = SAMPLE.index("[[fixes.hunks]]", start)
    block = SAMPLE[start:end]
    assert old in block, old
    return SAMPLE[:start] + block.replace(old, new, 1) + SAMPLE[end:]


H0 = "fix '38935'.hunks[0]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (hunk0('id = "prefill-door"', 'id = "prefill-door"\nowner = 1'), f"{H0}: unknown field(s) ['owner']"),
        (
            hunk0('id = "prefill-door"', 'id = "Prefill-door"'),
            f"{H0}.id: 'Prefill-door': use lowercase letters, digits and '-'",
        ),
        (hunk0('id = "prefill-door"', 'id = "-door"'), f"{H0}.id: '-door': use lowercase letters, digits and '-'"),
        (
            hunk0('id = "prefill-door"', 'id = "prefill_door"'),
            f"{H0}.id: 'prefill_door': use lowercase letters, digits and '-'",
        ),
        (
            hunk0('id = "prefill-door"', 'id = "prefill-door\\n"'),
            f"{H0}.id: 'prefill-door\\n': use lowercase letters, digits and '-'",
        ),
        (hunk0('id = "prefill-door"', 'id = ""'), f"{H0}.id: expected a non-empty string"),
        (hunk0('file = "sglang/srt/disaggregation/prefill.py"\n', ""), f"{H0}.file: expected a non-empty string"),
        (hunk0('function = "PrefillBootstrapQueue.add"\n', ""), f"{H0}.function: expected a non-empty string"),
        (
            hunk0('change = "a rejected request is retired at the door"\n', ""),
            f"{H0}.change: expected a non-empty string",
        ),
        (
            hunk0('fields = { pr38935_prefill_door = ["rejected.enqueued", "rejected.final_retired"] }', "fields = {}"),
            f"{H0}.fields: name the probe fields that observe this path ({{probe = [fields]}})",
        ),
        (
            hunk0('fields = { pr38935_prefill_door = ["rejected.enqueued", "rejected.final_retired"] }\n', ""),
            f"{H0}.fields: name the probe fields that observe this path ({{probe = [fields]}})",
        ),
        (
            hunk0(
                'fields = { pr38935_prefill_door = ["rejected.enqueued", "rejected.final_retired"] }',
                'fields = ["rejected.enqueued"]',
            ),
            f"{H0}.fields: expected a table, got list",
        ),
        (hunk0("pr38935_prefill_door = [", "pr1 = ["), f"{H0}.fields.pr1: not one of this fix's probes"),
        (
            hunk0('["rejected.enqueued", "rejected.final_retired"]', "[]"),
            f"{H0}.fields.pr38935_prefill_door: expected a non-empty list of expect field names",
        ),
        (
            hunk0('["rejected.enqueued", "rejected.final_retired"]', '"rejected.enqueued"'),
            f"{H0}.fields.pr38935_prefill_door: expected a non-empty list of expect field names",
        ),
        (
            hunk0('["rejected.enqueued", "rejected.final_retired"]', '["rejected.enqueued", 1]'),
            f"{H0}.fields.pr38935_prefill_door: expected a non-empty list of expect field names",
        ),
        (
            hunk0('"rejected.final_retired"]', '"rejected.final_retired", "valid.enqueued"]'),
            f"{H0}.fields.pr38935_prefill_door: 'valid.enqueued' is not an expect field of pr38935_prefill_door",
        ),
        (
            hunk0('["rejected.enqueued", "rejected.final_retired"]', '["rejected.enqueued"]'),
            "fix '38935'.hunks: expect field(s) ['pr38935_prefill_door:rejected.final_retired'] belong to no hunk",
        ),
        (
            edit('id = "decode-door"', 'id = "prefill-door"').replace(
                'hunks = ["decode-door"]', 'hunks = ["prefill-door"]'
            ),
            "fix '38935'.hunks: a hunk id is listed twice",
        ),
    ],
)
def test_hunk_rules(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def mutation0(old: str, new: str) -> str:
    start = SAMPLE.index('name = "drop-prefill-door-guard"')
    end = SAMPLE.index("[[fixes.mutations]]", start)
    block = SAMPLE[start:end]
    assert old in block, old
    return SAMPLE[:start] + block.replace(old, new, 1) + SAMPLE[end:]


M0 = "fix '38935'.mutations[0]"
PREFILL_PY = 'file = "sglang/srt/disaggregation/prefill.py"'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (mutation0('replace = "if False:"', 'replace = "if False:"\nowner = 1'), f"{M0}: unknown field(s) ['owner']"),
        (mutation0('name = "drop-prefill-door-guard"\n', ""), f"{M0}.name: expected a non-empty string"),
        (mutation0(PREFILL_PY + "\n", ""), f"{M0}.file: expected a non-empty string"),
        (mutation0('find = "if is_unadmitted_reject(req):"\n', ""), f"{M0}.find: expected a non-empty string"),
        (mutation0('replace = "if False:"\n', ""), f"{M0}.replace: expected a string (may be empty)"),
        (mutation0('replace = "if False:"', "replace = false"), f"{M0}.replace: expected a string (may be empty)"),
        # an absolute or escaping mutation path: selfcheck would read and rewrite that file
        (
            mutation0(PREFILL_PY, 'file = "/etc/hosts"'),
            f"{M0}.file: '/etc/hosts': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "/work/sglang/srt/x.py"'),
            f"{M0}.file: '/work/sglang/srt/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang/../../etc/hosts"'),
            f"{M0}.file: 'sglang/../../etc/hosts': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang/srt/.."'),
            f"{M0}.file: 'sglang/srt/..': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "../sglang/srt/x.py"'),
            f"{M0}.file: '../sglang/srt/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "./sglang/srt/x.py"'),
            f"{M0}.file: './sglang/srt/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang//srt/x.py"'),
            f"{M0}.file: 'sglang//srt/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang/./srt/x.py"'),
            f"{M0}.file: 'sglang/./srt/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang/"'),
            f"{M0}.file: 'sglang/': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang"'),
            f"{M0}.file: 'sglang': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "setup.py"'),
            f"{M0}.file: 'setup.py': must be a relative path inside the source's sglang/ tree",
        ),
        (
            mutation0(PREFILL_PY, 'file = "sglang_extra/x.py"'),
            f"{M0}.file: 'sglang_extra/x.py': must be a relative path inside the source's sglang/ tree",
        ),
        # hunks a mutation reverts
        (mutation0('hunks = ["prefill-door"]', 'hunks = "prefill-door"'), f"{M0}.hunks: expected a list of hunk ids"),
        (mutation0('hunks = ["prefill-door"]', "hunks = [1]"), f"{M0}.hunks: expected a list of hunk ids"),
        (
            mutation0('hunks = ["prefill-door"]', 'hunks = ["prefill-door", "side-door"]'),
            f"{M0}.hunks: 'side-door' is not one of this fix's hunks",
        ),
        (mutation0('hunks = ["prefill-door"]', "hunks = []"), f"{M0}.hunks: name the hunk(s) this mutation reverts"),
        (mutation0('hunks = ["prefill-door"]\n', ""), f"{M0}.hunks: name the hunk(s) this mutation reverts"),
        (
            edit('hunks = ["decode-door"]', 'hunks = ["prefill-door"]'),
            "fix '38935'.hunks: hunk(s) ['decode-door'] have no reverting mutation",
        ),
        # targets
        (
            mutation0('hunks = ["prefill-door"]', 'hunks = ["prefill-door"]\ntargets = []'),
            f"{M0}.targets: expected a non-empty list of probe names",
        ),
        (
            mutation0('hunks = ["prefill-door"]', 'hunks = ["prefill-door"]\ntargets = "pr38935_prefill_door"'),
            f"{M0}.targets: expected a non-empty list of probe names",
        ),
        (
            mutation0('hunks = ["prefill-door"]', 'hunks = ["prefill-door"]\ntargets = [1]'),
            f"{M0}.targets: expected a non-empty list of probe names",
        ),
        (
            mutation0(
                'hunks = ["prefill-door"]', 'hunks = ["prefill-door"]\ntargets = ["pr38935_prefill_door", "nope"]'
            ),
            f"{M0}.targets: 'nope' is not one of this fix's probes",
        ),
        (
            mutation0('hunks = ["prefill-door"]', 'hunks = ["prefill-door"]\ntargets = ["pr38935_decode_door"]'),
            f"{M0}.targets: the reverted hunks are observed by ['pr38935_prefill_door'] too",
        ),
        # names
        (
            edit('name = "drop-decode-door-guard"', 'name = "drop-prefill-door-guard"'),
            "fix '38935'.mutations: a mutation name is listed twice",
        ),
    ],
)
def test_mutation_rules(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def test_array_fields_must_be_arrays_of_tables(tmp_path: Path) -> None:
    head = SAMPLE[: SAMPLE.index("[[fixes.probes]]")]
    assert (
        refused(tmp_path, head + 'probes = "p"\n')
        == "fix '38935'.probes: expected an array of tables ([[fixes.probes]])"
    )
    assert (
        refused(tmp_path, head + 'hunks = "h"\n') == "fix '38935'.hunks: expected an array of tables ([[fixes.hunks]])"
    )
    assert refused(tmp_path, head + 'mutations = "m"\n') == (
        "fix '38935'.mutations: expected an array of tables ([[fixes.mutations]])"
    )
    assert refused(tmp_path, head + "probes = [1]\n") == "fix '38935'.probes[0]: expected a table, got int"
    assert refused(tmp_path, head + "hunks = [1]\n") == "fix '38935'.hunks[0]: expected a table, got int"
    assert refused(tmp_path, head + "mutations = [1]\n") == "fix '38935'.mutations[0]: expected a table, got int"


def test_a_fix_without_hunks_may_name_mutation_targets(tmp_path: Path) -> None:
    text = SAMPLE + (
        '[[fixes.mutations]]\nname = "m"\nfile = "sglang/srt/x.py"\nfind = "a"\nreplace = "b"\n'
        'targets = ["pr43719_failed_room_quarantine"]\n'
    )
    (mutation,) = load_matrix(write(tmp_path, text)).fixes[1].mutations
    assert (mutation.targets, mutation.hunks) == (("pr43719_failed_room_quarantine",), ())
    no_targets = SAMPLE + '[[fixes.mutations]]\nname = "m"\nfile = "sglang/srt/x.py"\nfind = "a"\nreplace = "b"\n'
    assert (
        refused(tmp_path, no_targets) == "fix '43719b'.mutations[0].targets: expected a non-empty list of probe names"
    )


def test_the_file_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_matrix(tmp_path / "absent.toml")
    assert str(err.value) == f"{tmp_path / 'absent.toml'}: cannot read matrix: No such file or directory"
    path = tmp_path / "m.toml"
    path.write_bytes(b'schema = 2\ntitle = "\xff"\n')
    with pytest.raises(ConfigError, match=r"m\.toml: not valid TOML: "):
        load_matrix(path)
    path.write_text("schema = = 2")
    with pytest.raises(ConfigError, match=r"m\.toml: not valid TOML: "):
        load_matrix(path)
    assert load_matrix(str(write(tmp_path, SAMPLE))).path == tmp_path / "m.toml"  # a str path works too


# -- the GPU tier's tables ----------------------------------------------------------------------------------

GPU = '[[gpu."38935".probes]]\nname = "gpu_oversized_prompt"\nexpect = { "rejected.leaked" = [true, false] }\n'


def gpu_refused(tmp_path: Path, gpu: str) -> str:
    m = load_matrix(write(tmp_path, SAMPLE + gpu))
    with pytest.raises(ConfigError) as err:
        load_gpu_plans(m)
    return str(err.value).removeprefix(f"{m.path}: ")


def test_gpu_plans_load(tmp_path: Path) -> None:
    m = load_matrix(
        write(tmp_path, SAMPLE + GPU + '[gpu."43719b"]\nthroughput = true\n' + GPU.replace("38935", "43719b"))
    )
    assert load_gpu_plans(m) == {
        "38935": GpuPlan(probes=(ProbeSpec("gpu_oversized_prompt", {"rejected.leaked": (True, False)}, {}, {}),)),
        "43719b": GpuPlan(
            probes=(ProbeSpec("gpu_oversized_prompt", {"rejected.leaked": (True, False)}, {}, {}),), throughput=True
        ),
    }
    assert load_gpu_plans(load_matrix(write(tmp_path, SAMPLE))) == {}


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (GPU.replace('"38935"', '"41404"'), "gpu.'41404': no fix '41404' in this matrix (known: 38935, 43719b)"),
        ('[gpu]\n"38935" = 1\n', "gpu.'38935': expected a table, got int"),
        ('[gpu."38935"]\nowner = 1\n' + GPU, "gpu.'38935': unknown field(s) ['owner']"),
        (
            '[gpu."38935"]\nthroughput = true\n',
            "gpu.'38935'.probes: expected at least one [[gpu.\"38935\".probes]] table",
        ),
        ('[gpu."38935"]\nprobes = []\n', "gpu.'38935'.probes: expected at least one [[gpu.\"38935\".probes]] table"),
        ('[gpu."38935"]\nthroughput = 1\n' + GPU, "gpu.'38935'.throughput: expected true or false"),
        (
            GPU.replace("[true, false]", "[true, true]"),
            "gpu.'38935'.probes[0].expect.'rejected.leaked': base and head values are equal: that is a control",
        ),
    ],
)
def test_gpu_rules(tmp_path: Path, gpu: str, message: str) -> None:
    assert gpu_refused(tmp_path, gpu) == message


def test_gpu_tables_must_be_tables(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, edit("schema = 2\n", "schema = 2\ngpu = 1\n")))
    with pytest.raises(ConfigError) as err:
        load_gpu_plans(m)
    assert str(err.value) == f"{m.path}: gpu: expected a table, got int"


def test_gpu_plans_refuse_a_matrix_changed_since_it_was_loaded(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, SAMPLE + GPU))
    m.path.write_text(SAMPLE + GPU + "\n")
    with pytest.raises(ConfigError) as err:
        load_gpu_plans(m)
    assert str(err.value) == f"{m.path}: changed since it was loaded; run again"


def test_a_channel_is_everything_after_the_scenario(tmp_path: Path) -> None:
    """``rejected.kv.freed`` measures ``kv.freed``: a control on ``freed`` alone measures something else."""
    text = probe0('"rejected.enqueued" = [true, false]', '"rejected.kv.freed" = [0, 1]').replace(
        '["rejected.enqueued", "rejected.final_retired"]', '["rejected.kv.freed", "rejected.final_retired"]'
    )
    assert refused(tmp_path, text.replace('"valid.enqueued" = true', '"valid.freed" = 1')) == (
        f"{P0}.expect.'rejected.kv.freed': no control measures 'kv.freed': add a control scenario's "
        "'<scenario>.kv.freed' (or map the field in channels)"
    )
    loaded = load_matrix(write(tmp_path, text.replace('"valid.enqueued" = true', '"valid.kv.freed" = 1')))
    assert loaded.fixes[0].probes[0].controls == {"valid.kv.freed": 1, "valid.retired": False}


def test_a_matrix_of_commits_needs_no_releases(tmp_path: Path) -> None:
    text = "schema = 2\n" + SAMPLE[SAMPLE.index("[[fixes]]") : SAMPLE.index(ROOM)]
    text = text.replace('base = { release = "0.5.20" }', 'base = { commit = "17ba2c2e" }').replace(
        'head = { release = "0.5.21" }', 'head = { commit = "8f3d6944" }'
    )
    m = load_matrix(write(tmp_path, text))
    assert m.releases == {} and (m.fixes[0].base.commit, m.fixes[0].head.commit) == ("17ba2c2e", "8f3d6944")


def test_select_by_an_id_that_starts_like_a_label(tmp_path: Path) -> None:
    from difflab.matrix.model import Matrix

    fix = Fix(id="X1", pr=5, title="t", base=SidePin(release="a"), head=SidePin(release="b"), probes=())
    matrix = Matrix(path=tmp_path / "m.toml", sha256="0" * 64, releases={}, fixes=(fix,))
    assert matrix.select(["X1"]) == matrix.select(["#X1"]) == matrix.select(["#5"]) == [fix]


UPSTREAM = 'upstream_tests = ["test/registered/unit/disaggregation/test_admission_abort_not_enqueued.py"]'
OWN_IDS = "(Class::test_method or a test function's name)"


def upstream(value: str) -> str:
    """The sample with the first fix's ``upstream_tests`` set to ``value``."""
    return edit(UPSTREAM, f"upstream_tests = {value}")


def throughput(lines: str) -> str:
    """The sample with ``lines`` after the first fix's scalar fields (where ``[fixes.throughput]`` goes)."""
    return edit(UPSTREAM, f"{UPSTREAM}\n{lines}")


def test_upstream_tests_may_name_the_tests_a_fix_owns(tmp_path: Path) -> None:
    text = upstream('["test/srt/test_a.py", { file = "test/srt/test_b.py", own = ["TestB::test_x", "test_y"] }]')
    fix = load_matrix(write(tmp_path, text)).fixes[0]
    assert fix.upstream_tests == (
        UpstreamTestFile("test/srt/test_a.py", ()),
        UpstreamTestFile("test/srt/test_b.py", ("TestB::test_x", "test_y")),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            upstream('[{ file = "test/srt/test_b.py", owner = "me" }]'),
            "fix '38935'.upstream_tests[0]: unknown key(s) ['owner'] (known: file, own)",
        ),
        (upstream('[{ own = ["TestB::test_x"] }]'), "fix '38935'.upstream_tests[0].file: expected a non-empty string"),
        *(
            (
                upstream(f"[{path!r}]".replace("'", '"')),
                f"fix '38935'.upstream_tests[0].file: {path!r} is not a relative path to a .py file inside "
                "SGLang's repository",
            )
            for path in ("/src/sglang/test/srt/test_a.py", "test\\srt\\test_a.py", "test/../test_a.py", "test/a.txt")
        ),
        (
            upstream('[{ file = "test/srt/test_b.py", own = "TestB::test_x" }]'),
            f"fix '38935'.upstream_tests[0].own: expected a list of test ids {OWN_IDS}",
        ),
        (
            upstream('[{ file = "test/srt/test_b.py", own = [1] }]'),
            f"fix '38935'.upstream_tests[0].own: expected a list of test ids {OWN_IDS}",
        ),
        (
            upstream('[{ file = "test/srt/test_b.py", own = ["TestB::test_x", " "] }]'),
            f"fix '38935'.upstream_tests[0].own: expected a list of test ids {OWN_IDS}",
        ),
        (
            upstream('["test/srt/test_b.py", { file = "test/srt/test_b.py", own = ["TestB::test_x"] }]'),
            "fix '38935'.upstream_tests[1]: test/srt/test_b.py is listed twice",
        ),
    ],
)
def test_upstream_test_rules(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


def test_a_fix_names_its_throughput_probe(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, throughput('[fixes.throughput]\nprobe = "pr38935_doors"')))
    assert [f.throughput for f in m.fixes] == ["pr38935_doors", None]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (throughput('throughput = "pr38935_doors"'), "fix '38935'.throughput: expected a table, got str"),
        (
            throughput('[fixes.throughput]\nprobe = "pr38935_doors"\nrounds = 3'),
            "fix '38935'.throughput: unknown field(s) ['rounds']",
        ),
        (throughput("[fixes.throughput]"), "fix '38935'.throughput.probe: expected a non-empty string"),
        (
            throughput('[fixes.throughput]\nprobe = "pr38935-doors"'),
            "fix '38935'.throughput.probe: 'pr38935-doors' is not a probe module name",
        ),
    ],
)
def test_throughput_rules(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text) == message


# -- transport back ends ----------------------------------------------------------------------
ON_BACKENDS = 'name = "pr38935_decode_door"\nbackends = ["mooncake", "nixl"]'


def test_a_probe_on_back_ends_expands_its_fields_paths_and_mutations(tmp_path: Path) -> None:
    fix = load_matrix(write(tmp_path, edit('name = "pr38935_decode_door"', ON_BACKENDS))).fix("38935")
    decode = fix.probes[1]
    assert decode.backends == ("mooncake", "nixl")
    assert decode.expect == {"mooncake:rejected.pending": (True, False), "nixl:rejected.pending": (True, False)}
    assert decode.controls == {"mooncake:valid.pending": True, "nixl:valid.pending": True}
    paths = {h.id: (h.backend, h.fields) for h in fix.hunks}
    assert paths["decode-door@nixl"] == ("nixl", {"pr38935_decode_door": ("nixl:rejected.pending",)})
    assert paths["prefill-door"][0] is None  # a back-end independent probe keeps one path
    mutation = next(m for m in fix.mutations if m.name == "drop-decode-door-guard")
    assert mutation.hunks == ("decode-door@mooncake", "decode-door@nixl")  # the declared id names each copy


def _on_backends(old: str, new: str) -> str:
    return edit(old, new).replace('name = "pr38935_decode_door"', ON_BACKENDS, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            edit('name = "pr38935_decode_door"', 'name = "pr38935_decode_door"\nbackends = ["nixl", "nixl"]'),
            "a back end is listed twice",
        ),
        (
            edit('name = "pr38935_decode_door"', 'name = "pr38935_decode_door"\nbackends = ["NIXL"]'),
            "expected a list of back-end names",
        ),
        (
            _on_backends(
                'fields = { pr38935_decode_door = ["rejected.pending"] }',
                'fields = { pr38935_decode_door = ["rejected.pending"] }\nbackends = ["mori"]',
            ),
            "not among its probes' back ends",
        ),
        (
            _on_backends('"valid.pending" = true', '"valid.pending" = true\n"not-applicable" = "x"'),
            "is the field a back end without the fix reports",
        ),
    ],
)
def test_back_end_rules(tmp_path: Path, text: str, message: str) -> None:
    assert message in refused(tmp_path, text)
