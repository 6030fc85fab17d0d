"""What a probe hands the kit comes back in its raw result exactly as the lab reads it.

Each probe here is a small file run by :func:`difflab.probe.child.run_probe`, the function the
probe process runs; its result (status, error, fields, events, problems, defaults, forced,
fallbacks) is what the runner turns into an observation. A kit that renames a field, drops an
event or loses a problem changes the verdict built from it.
"""

from __future__ import annotations

import functools
import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest

from difflab.probe.child import run_probe
from difflab.probe.kit import WATCHED_LOGGER, EndOfScenario, Kit, LoggedError, Recorder, backend_field


def observed(tmp_path: Path, body: str, name: str = "probe") -> dict[str, Any]:
    """The raw result of a probe whose module is ``body``."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return run_probe(path, Kit())


def test_per_backend_fields_are_named_as_the_matrix_declares_them(tmp_path: Path) -> None:
    res = observed(
        tmp_path,
        """
        def observe(kit):
            return {**kit.on_backend("nixl", {"failed.held": True, "aborted": 2}),
                    **kit.backend_not_applicable("mori", "this build has no mori back end")}
        """,
    )
    assert res["status"] == "ok"
    assert res["fields"] == {
        "mori:not-applicable": "this build has no mori back end",
        "nixl:aborted": 2,
        "nixl:failed.held": True,
    }
    assert backend_field("mooncake", "x.y") == "mooncake:x.y"


def test_a_recorder_returns_its_value_and_keeps_every_call(tmp_path: Path) -> None:
    res = observed(
        tmp_path,
        """
        def observe(kit):
            send = kit.recorder("send", returns="sent")
            poll = kit.recorder("poll", side_effect=lambda room, *, wait: room * 10 + wait)
            return {"send.out": send(7, dst="decode"), "send.again": send(), "send.count": send.count,
                    "send.calls": [[list(c.args), c.kwargs] for c in send.calls],
                    "poll.out": poll(4, wait=2), "poll.count": poll.count, "send.repr": repr(send)}
        """,
    )
    assert res["status"] == "ok", res["error"]
    assert res["fields"] == {
        "poll.count": 1,
        "poll.out": 42,
        "send.again": "sent",
        "send.calls": [[[7], {"dst": "decode"}], [[], {}]],
        "send.count": 2,
        "send.out": "sent",
        "send.repr": "<Recorder send x2>",
    }
    assert repr(Recorder("x")) == "<Recorder x x0>"


def test_every_plain_callable_of_a_fake_is_guarded_and_nothing_else_is(tmp_path: Path) -> None:
    """A function, lambda, bound method or partial that raises is a problem, set at construction or later."""
    res = observed(
        tmp_path,
        """
        import functools

        class Peer:
            def ping(self):
                raise ConnectionError("peer gone")

        def fails(code):
            raise ValueError(f"bad code {code}")

        def observe(kit):
            rec = kit.recorder("rec")
            fake = kit.fake("sender", ping=Peer().ping, poll=functools.partial(fails, 3), rec=rec, cls=Peer, n=5)
            fake.later = lambda: 1 / 0
            for call in (fake.ping, fake.poll, fake.later):
                try:
                    call()
                except Exception:
                    pass
            return {"s.same_recorder": fake.rec is rec, "s.same_class": fake.cls is Peer, "s.n": fake.n,
                    "s.repr": repr(fake)}
        """,
    )
    assert res["fields"] == {"s.n": 5, "s.repr": "<fake sender>", "s.same_class": True, "s.same_recorder": True}
    assert res["problems"] == [
        "exception raised inside a fake: sender.ping: ConnectionError: peer gone",
        "exception raised inside a fake: sender.poll: ValueError: bad code 3",
        "exception raised inside a fake: sender.later: ZeroDivisionError: division by zero",
    ]
    assert res["status"] == "error"
    assert res["error"] == "observation not trustworthy: " + "; ".join(res["problems"])


def test_a_fake_missing_an_attribute_is_one_problem_however_often_it_is_read(tmp_path: Path) -> None:
    """Python's own protocol lookups (``__len__``, ``__iter__``) are not the probe's to provide."""
    res = observed(
        tmp_path,
        """
        def observe(kit):
            fake = kit.fake("engine", ready=True)
            has_len = hasattr(fake, "__len__")
            for name in ("transfer", "transfer", "transfer", "__shadow", "shadow__"):
                try:
                    getattr(fake, name)
                except BaseException:
                    pass
            return {"e.ready": fake.ready, "e.has_len": has_len}
        """,
    )
    assert res["fields"] == {"e.has_len": False, "e.ready": True}
    assert res["problems"] == [
        "missing fake attribute: engine.transfer",
        "missing fake attribute: engine.__shadow",
        "missing fake attribute: engine.shadow__",
    ]
    assert res["status"] == "error"
    with pytest.raises(AttributeError, match="^__len__$"):
        Kit().fake("engine").__len__  # noqa: B018 - the read is the test


def test_a_path_this_source_lacks_is_not_applicable_with_the_reason(tmp_path: Path) -> None:
    res = observed(tmp_path, "def observe(kit):\n    kit.not_applicable('no deferral queue in this build')\n")
    assert (res["status"], res["error"]) == ("n/a", "not applicable: no deferral queue in this build")


def test_a_missing_attribute_that_escapes_names_the_fake(tmp_path: Path) -> None:
    res = observed(tmp_path, "def observe(kit):\n    return {'x': kit.fake('mgr').engine}\n")
    assert res["status"] == "error"
    assert res["error"] == "probe fake incomplete: fake mgr.engine is not provided by the probe"


def test_an_intended_failure_is_an_event_with_where_what_and_the_exception(tmp_path: Path) -> None:
    res = observed(
        tmp_path,
        """
        def observe(kit):
            refused = kit.intended_failure("the transport refuses the abort")
            def abort(room):
                raise refused(f"room {room} refused")
            guarded = kit.guard(abort)
            try:
                guarded(7)
            except RuntimeError:
                pass
            return {"cls": refused.__name__, "module": refused.__module__}
        """,
    )
    assert res["status"] == "ok", res["error"]
    assert res["fields"] == {"cls": "IntendedRuntimeError", "module": "difflab.probe.kit"}
    assert res["events"] == [
        {
            "event": "intended_failure",
            "where": "abort",
            "what": "the transport refuses the abort",
            "exception": "IntendedRuntimeError: room 7 refused",
        }
    ]


def test_a_guard_names_a_callable_without_a_name_by_its_repr_and_reraises() -> None:
    kit = Kit()

    def fails(code: int) -> None:
        raise KeyError(code)

    part = functools.partial(fails, 9)
    with pytest.raises(KeyError):
        kit.guard(part)()
    assert kit.raised == [f"{part!r}: KeyError: 9"]
    with pytest.raises(KeyError):
        kit.guard(part, "pool.take")()
    assert kit.raised[1] == "pool.take: KeyError: 9"
    assert kit.guard(lambda x: x + 1, "inc")(1) == 2


def test_ending_the_scenario_is_not_a_problem(tmp_path: Path) -> None:
    """A drained queue ends SGLang's loop on purpose: ``EndOfScenario`` or any class with ``ends_scenario``."""
    res = observed(
        tmp_path,
        """
        from difflab.probe.kit import EndOfScenario

        class Drained(Exception):
            ends_scenario = True

        def observe(kit):
            ends = 0
            for exc in (EndOfScenario("queue empty"), Drained("no more")):
                def pop(exc=exc):
                    raise exc
                try:
                    kit.fake("queue", pop=pop).pop()
                except BaseException:
                    ends += 1
            return {"q.ends": ends}
        """,
    )
    assert (res["status"], res["fields"], res["problems"], res["events"]) == ("ok", {"q.ends": 2}, [], [])
    assert EndOfScenario.ends_scenario is True


def test_an_intended_failure_must_derive_from_an_exception_class() -> None:
    kit = Kit()
    for base in (KeyboardInterrupt, "RuntimeError", None):
        with pytest.raises(TypeError, match="an intended failure derives from an Exception class, not"):
            kit.intended_failure("x", base)  # type: ignore[arg-type]
    assert kit.intended_failure("x", OSError).__name__ == "IntendedOSError"


def test_defaults_forced_flags_and_fallbacks_are_kept_once_each(tmp_path: Path) -> None:
    """A bench builds thousands of alike objects: each distinct entry once, in order, with every key."""
    res = observed(
        tmp_path,
        """
        def observe(kit):
            for _ in range(2):
                kit.build_default("prefill.lifecycle", "None", "PrefillBootstrapQueue.__init__")
                kit.forced_flag("enable_deferral", True, False, "ServerArgs", ["SGLANG_DEFER"])
                kit.forced_flag("page_size", 16, [1, 2], "ServerArgs", [])
                kit.forced_flag("mode", "x", None, "ServerArgs", [])
                kit.fallback("mgr._cache", "created lazily")
            kit.build_default("prefill.lifecycle", "0", "PrefillBootstrapQueue.__init__")
            kit.forced_flag("enable_deferral", True, 1.5, "ServerArgs", ["SGLANG_DEFER"])
            kit.fallback("mgr._cache", "another reason")
            return {}
        """,
    )
    assert res["status"] == "ok", res["error"]
    assert res["defaults"] == [
        {"attribute": "prefill.lifecycle", "value": "None", "from": "PrefillBootstrapQueue.__init__"},
        {"attribute": "prefill.lifecycle", "value": "0", "from": "PrefillBootstrapQueue.__init__"},
    ]
    forced = {"from": "ServerArgs"}
    assert res["forced"] == [
        {**forced, "attribute": "enable_deferral", "value": True, "build_default": False, "env": ["SGLANG_DEFER"]},
        {**forced, "attribute": "page_size", "value": 16, "build_default": "[1, 2]", "env": []},
        {**forced, "attribute": "mode", "value": "x", "build_default": None, "env": []},
        {**forced, "attribute": "enable_deferral", "value": True, "build_default": 1.5, "env": ["SGLANG_DEFER"]},
    ]
    assert res["fallbacks"] == [
        {"attribute": "mgr._cache", "why": "created lazily"},
        {"attribute": "mgr._cache", "why": "another reason"},
    ]


def test_events_keep_their_order_and_data(tmp_path: Path) -> None:
    res = observed(
        tmp_path,
        "def observe(kit):\n    kit.event('enqueued', room=7)\n    kit.event('ack')\n    return {}\n",
    )
    assert res["events"] == [{"event": "enqueued", "room": 7}, {"event": "ack"}]


LOGS = """
import logging

pd = logging.getLogger("sglang.srt.disaggregation.prefill")
elsewhere = logging.getLogger("sglang.srt.managers")

def observe(kit):
    {allow}
    try:
        raise ConnectionError("peer reset")
    except ConnectionError:
        pd.debug("abort notify failed", exc_info=True)             # PD code swallowing at debug level
        logging.getLogger("sglang.srt.disaggregation").debug("top", exc_info=True)
        logging.getLogger("sglang.srt.disaggregationx").debug("not PD", exc_info=True)
        elsewhere.warning("not an error", exc_info=True)
    pd.debug("no exception, no problem")
    pd.info("handed an exception it never raised", exc_info=ConnectionError("refused"))
    elsewhere.error("queue %s is stuck", "q1")
    elsewhere.critical("malformed %s %s", 1)
    return {{}}
"""


@pytest.fixture
def quiet_handler_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest's log capture raises on a malformed record; a probe process's handlers only print it."""
    monkeypatch.setattr(logging, "raiseExceptions", False)


@pytest.mark.usefixtures("quiet_handler_errors")
def test_errors_and_exception_carrying_pd_records_are_problems(tmp_path: Path) -> None:
    res = observed(tmp_path, LOGS.format(allow="pass"))
    assert res["status"] == "error"
    first_lines = [p.splitlines()[0] for p in res["problems"]]
    assert first_lines == [
        "SGLang logged an error (sglang.srt.disaggregation.prefill): abort notify failed",
        "SGLang logged an error (sglang.srt.disaggregation): top",
        "SGLang logged an error (sglang.srt.disaggregation.prefill): handed an exception it never raised",
        "SGLang logged an error (sglang.srt.managers): queue q1 is stuck",
        "SGLang logged an error (sglang.srt.managers): malformed %s %s",
    ]
    traceback = res["problems"][0].splitlines()
    assert traceback[1] == "Traceback (most recent call last):" and traceback[2].startswith('  File "')
    assert res["problems"][2].splitlines()[1:] == ["ConnectionError: refused"]
    assert res["problems"][0].endswith("ConnectionError: peer reset")
    assert res["problems"][3] == first_lines[3]  # no exception, no traceback
    assert res["error"] == "observation not trustworthy: " + "; ".join(first_lines)


@pytest.mark.usefixtures("quiet_handler_errors")
def test_an_allowed_pattern_matches_the_message_or_the_traceback(tmp_path: Path) -> None:
    """The text searched is the message, a newline, then the traceback if the record carries one."""
    allow = "kit.allow_log('peer reset'); kit.allow_log('peer reset'); kit.allow_log('refused')"
    res = observed(tmp_path, LOGS.format(allow=allow))
    assert [p.splitlines()[0].split(": ", 1)[1] for p in res["problems"]] == ["queue q1 is stuck", "malformed %s %s"]
    whole_lines = "(?m)^abort notify failed$|^top\\nTraceback|refused"  # the message, then its traceback
    anchored = f"kit.allow_log({whole_lines!r})\n    kit.allow_log('stuck$|malformed')"
    res = observed(tmp_path, LOGS.format(allow=anchored), "anchored")
    assert (res["status"], res["problems"]) == ("ok", [])


def test_allowing_a_pattern_again_keeps_one() -> None:
    kit = Kit()
    for pattern in ("transfer failed", "transfer failed", "room \\d+"):
        kit.allow_log(pattern)
    assert [p.pattern for p in kit.allowed_log_patterns] == ["transfer failed", "room \\d+"]


def test_logged_records_read_back_with_their_level_and_exception() -> None:
    kit = Kit()
    log = logging.getLogger(WATCHED_LOGGER + ".decode")
    with kit.capture_logs():
        try:
            raise OSError("link down")
        except OSError:
            log.info("failed %d", 3, exc_info=True)
        logging.getLogger("other").error("plain")
    first, second = kit.logged_errors
    assert (first.logger, first.level, first.message, first.intended) == (log.name, "INFO", "failed 3", None)
    assert first.exc is not None and first.exc.endswith("OSError: link down")
    assert second.as_dict() == {"logger": "other", "level": "ERROR", "message": "plain", "exc": None}


class Seen(logging.Handler):
    """What a handler the probe's own logging set up receives."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_opening_the_pd_loggers_adds_nothing_to_the_probes_own_log() -> None:
    watched = logging.getLogger(WATCHED_LOGGER)
    pd = logging.getLogger(WATCHED_LOGGER + ".prefill")
    seen, root = Seen(), logging.getLogger()
    root.addHandler(seen)
    before = watched.level
    chatty = logging.getLogger("sglang.srt.chatty")
    chatty.setLevel(logging.INFO)
    try:
        kit = Kit()
        with kit.capture_logs():
            assert watched.level == logging.DEBUG
            try:
                raise OSError("x")
            except OSError:
                pd.debug("swallowed", exc_info=True)
            pd.warning("shown as before")
            pd.info("hidden as before")
            chatty.info("not PD: shown as before")
        assert watched.level == before and root.handlers.count(seen) == 1
        assert seen.filters == [] and not any(type(h).__name__ == "_Collector" for h in root.handlers)
        pd.warning("after")
    finally:
        root.removeHandler(seen)
        chatty.setLevel(logging.NOTSET)
    assert seen.messages == ["shown as before", "not PD: shown as before", "after"]
    assert [r.message for r in kit.logged_errors] == ["swallowed"]


def test_a_bench_keeps_the_deployments_log_levels_and_still_collects_errors() -> None:
    watched = logging.getLogger(WATCHED_LOGGER)
    before = watched.level
    kit = Kit()
    with kit.capture_logs(open_pd_loggers=False):
        assert watched.level == before
        try:
            raise OSError("x")
        except OSError:
            logging.getLogger(WATCHED_LOGGER + ".prefill").debug("swallowed", exc_info=True)
        logging.getLogger("sglang.other").error("counted")
    logging.getLogger("sglang.other").error("after the bench")
    assert [r.message for r in kit.logged_errors] == ["counted"]


def test_a_staged_failure_quoted_in_a_log_is_not_a_problem_if_its_message_is_specific(tmp_path: Path) -> None:
    """Quoting counts from 12 characters on: a short message ("x") would excuse unrelated errors."""
    kit = Kit()
    kit.intended_messages += ["12 chars msg", "11 chars ms"]
    kit.logged_errors += [
        LoggedError("sglang.a", "ERROR", "could not notify: 12 chars msg", None),
        LoggedError("sglang.a", "ERROR", "could not notify: 11 chars ms", None),
        LoggedError("sglang.a", "ERROR", "pool exhausted", None, intended="the transport refuses"),
        LoggedError("sglang.a", "ERROR", "pool exhausted", None),
    ]
    assert [r.message for r in kit.unexpected_logs()] == ["could not notify: 11 chars ms", "pool exhausted"]
    assert kit.unexpected_logs()[1].intended is None
