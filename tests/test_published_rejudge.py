"""Judge the committed published observations again with the matrix they were judged by, and variants of them.

No SGLang is needed: the observations are the real ones a run recorded (results/published/upstream), so the
verdict logic is exercised on real field names, real values and a real declared-unavailable side. Each
variant changes one thing, the way a broken run, a swapped pin or a misbehaving probe would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from difflab.diff.likeness import judge_backport
from difflab.diff.verdict import FixVerdict, judge_all
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.workflows.merge import label

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "upstream"
MATRIX = load_matrix(PUBLISHED / "matrix.toml")
UNAVAILABLE = (
    "no release up to 0.5.23 carries it: handle_inflight_transfer_failure still inserts the failed room's KV "
    "into the radix tree; a git commit is needed as head"
)
PUBLISHED_VERDICTS = {
    "36988": ("confirmed", "1 probe(s): base shows the bug, head the fix, controls equal"),
    "38935": ("confirmed", "2 probe(s): base shows the bug, head the fix, controls equal"),
    "41404": ("confirmed", "1 probe(s): base shows the bug, head the fix, controls equal"),
    "43719a": ("confirmed", "1 probe(s): base shows the bug, head the fix, controls equal"),
    "43719b": (
        "unavailable",
        f"pr43719_failed_room_quarantine: head unavailable: {UNAVAILABLE}; base shows the bug",
    ),
}


def observations() -> list[Observation]:
    return [Observation.read(p) for p in sorted(PUBLISHED.glob("observations/*/*/*.json"))]


def find(observed: list[Observation], fix: str, side: str, probe: str | None = None) -> Observation:
    return next(o for o in observed if o.fix == fix and o.side == side and (probe is None or o.probe == probe))


def judged(observed: list[Observation]) -> dict[str, FixVerdict]:
    labels = {(o.fix, o.side): label(o) for o in observed}
    return {v.id: v for v in judge_all(list(MATRIX.fixes), observed, labels)}


def summary(verdicts: dict[str, FixVerdict]) -> dict[str, tuple[str, str]]:
    return {k: (v.verdict, v.reason) for k, v in verdicts.items()}


def test_the_published_observations_judge_as_published() -> None:
    verdicts = judged(observations())
    assert summary(verdicts) == PUBLISHED_VERDICTS
    assert all(v.passed for v in verdicts.values())
    assert verdicts["43719b"].expected_unavailable and not verdicts["38935"].expected_unavailable
    assert [(v.base["label"], v.head["label"]) for v in verdicts.values()] == [
        ("0.5.19", "0.5.20"),
        ("0.5.20", "0.5.21"),
        ("0.5.20", "0.5.21"),
        ("0.5.21", "0.5.22"),
        ("0.5.21", "unavailable"),
    ]
    assert all(f.ok for v in verdicts.values() for p in v.probes for f in p.fields)


def test_sides_swapped() -> None:
    """The head's observations as base and the base's as head: no fix shows its bug on the "base"."""
    observed = observations()
    for obs in observed:
        obs.side = {"base": "head", "head": "base"}[obs.side]
    verdicts = judged(observed)
    assert {k: v.verdict for k, v in verdicts.items()} == {
        "36988": "not-reproduced",
        "38935": "not-reproduced",
        "41404": "not-reproduced",
        "43719a": "not-reproduced",
        # A base without a source is a state the matrix can declare (a fix older than every pin), so the
        # swapped fix reads `unavailable`, saying what the head shows: the bug, not the fix. It still fails:
        # the matrix declares #43719(b)'s head unavailable and pins its base, so the gap is on the wrong side.
        "43719b": "unavailable",
    }
    assert verdicts["43719b"].reason == (
        f"pr43719_failed_room_quarantine: base unavailable: {UNAVAILABLE}; head does not show the fix (base)"
    )
    assert not verdicts["43719b"].expected_unavailable
    assert verdicts["38935"].reason.startswith(
        "pr38935_prefill_door: base does not show the bug: rejected.enqueued=False (expected True), "
        "rejected.sender_created=False (expected True), rejected.retired=True (expected False), "
        "rejected.streamed=[400] (expected []), rejected.cache_aborts=1 (expected 0); pr38935_decode_door: "
    )
    assert not any(v.passed for v in verdicts.values())


def test_a_base_control_drifted() -> None:
    observed = observations()
    find(observed, "38935", "base", "pr38935_decode_door").fields["retracted.retracted_queue"] = False
    verdicts = judged(observed)
    assert summary(verdicts)["38935"] == (
        "control-drift",
        "pr38935_decode_door: control field(s) changed or off their declared value: retracted.retracted_queue",
    )
    assert {k: v for k, v in summary(verdicts).items() if k != "38935"} == {
        k: v for k, v in PUBLISHED_VERDICTS.items() if k != "38935"
    }
    drifted = next(f for f in verdicts["38935"].probes[1].fields if f.field == "retracted.retracted_queue")
    assert (drifted.kind, drifted.base, drifted.head, drifted.ok) == ("control", False, True, False)


def test_a_mixed_base_with_a_fixed_head() -> None:
    """A base that already carries half the fix (a backport on the base pin) does not reproduce the bug."""
    observed = observations()
    find(observed, "36988", "base").fields["aborted.retired"] = True
    assert summary(judged(observed))["36988"] == (
        "not-reproduced",
        "pr36988_retire_aborted: base does not show the bug: aborted.retired=True (expected False)",
    )


def test_a_head_that_still_shows_part_of_the_bug() -> None:
    observed = observations()
    find(observed, "41404", "head").fields["failed.held"] = False
    verdict, reason = summary(judged(observed))["41404"]
    assert (verdict, reason) == (
        "not-fixed",
        "pr41404_deferred_release: head does not show the fix: failed.held=False (expected True)",
    )


def test_an_undeclared_unavailable_side_does_not_pass() -> None:
    observed = [o for o in observations() if (o.fix, o.side) != ("41404", "head")]
    observed.append(Observation.unavailable("41404", "pr41404_deferred_release", "head", "wheel not downloadable"))
    verdicts = judged(observed)
    v = verdicts["41404"]
    assert (v.verdict, v.reason) == (
        "unavailable",
        "pr41404_deferred_release: head unavailable: wheel not downloadable; base shows the bug",
    )
    assert (v.expected_unavailable, v.passed) == (False, False)
    assert verdicts["43719b"].passed  # the declared one still passes


def test_an_error_observation_that_still_carries_fields() -> None:
    observed = observations()
    head = find(observed, "43719a", "head")
    head.status = "error"
    head.error = "Traceback (most recent call last):\nStrictFakeMissing: FakeSender has no attribute 'poll'"
    assert head.fields  # every field the fix changes is still there, with its head value
    assert summary(judged(observed))["43719a"] == (
        "error",
        "pr43719_failed_send_ack: head: StrictFakeMissing: FakeSender has no attribute 'poll'",
    )


def test_a_head_pinned_to_the_base_release() -> None:
    observed = [o for o in observations() if (o.fix, o.side) != ("38935", "head")]
    for obs in [find(observed, "38935", "base", p) for p in ("pr38935_prefill_door", "pr38935_decode_door")]:
        observed.append(Observation.from_dict(dict(obs.to_dict(), side="head")))
    verdict, reason = summary(judged(observed))["38935"]
    assert verdict == "not-fixed"
    assert reason.startswith(
        "pr38935_prefill_door: head does not show the fix: rejected.enqueued=True (expected False)"
    )


# -- the same observations as a fork: backport verdicts ----------------------------------------------------


def fork(fix_id: str, sides: dict[str, str]) -> dict[str, Observation]:
    return {o.probe: o for o in observations() if o.fix == fix_id and o.side == sides.get(o.probe, sides["*"])}


@pytest.mark.parametrize("fix_id", ["36988", "38935", "41404", "43719a"])
def test_a_fork_behaving_like_the_head_or_the_base(fix_id: str) -> None:
    fix = MATRIX.fix(fix_id)
    present = judge_backport(fix, fork(fix_id, {"*": "head"}))
    absent = judge_backport(fix, fork(fix_id, {"*": "base"}))
    n = len(fix.probes)
    assert (present.verdict, present.reason) == (
        "present",
        f"all {n} probe(s) behave like the fix's head; controls hold",
    )
    assert (absent.verdict, absent.reason) == ("absent", f"all {n} probe(s) behave like the fix's base (the bug)")


def test_a_fork_with_one_door_ported() -> None:
    v = judge_backport(MATRIX.fix("38935"), fork("38935", {"pr38935_prefill_door": "head", "*": "base"}))
    assert (v.verdict, v.reason) == ("partial", "like head: pr38935_prefill_door; like base: pr38935_decode_door")


def test_a_fork_observed_where_no_source_exists() -> None:
    v = judge_backport(MATRIX.fix("43719b"), fork("43719b", {"*": "head"}))
    assert (v.verdict, v.reason) == ("error", f"pr43719_failed_room_quarantine: probe error: {UNAVAILABLE}")
