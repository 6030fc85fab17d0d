"""What a probe sees while it drives real SGLang code.

Runs inside the shared SGLang environment, so it uses the standard library
only. Its job is to keep a probe honest: a fake that lacks an attribute, an
exception that SGLang swallowed, or an error SGLang logged must surface as a
probe *error*, never as a behavioural observation (SGLang's
``transfer_worker`` and ``pop_transferred`` catch ``Exception`` and would
otherwise turn a broken fake into a "fixed" verdict).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


class MissingFakeAttribute(BaseException):
    """A fake was asked for an attribute the probe did not give it.

    Derives from ``BaseException`` so that SGLang's ``except Exception``
    handlers cannot swallow it; the kit records it as well, in case code
    catches ``BaseException``.
    """


class EndOfScenario(BaseException):  # noqa: N818 - a signal, not an error
    """Raised by a fake on purpose to end an SGLang loop (a drained queue); never recorded as a problem.

    Any exception class with a true ``ends_scenario`` attribute is treated the same way.
    """

    ends_scenario = True


"""Attribute :meth:`Kit.intended_failure` sets on an exception a scenario raises on purpose (its value: why)."""


class ProbeFailure(Exception):
    """A probe decided it cannot observe anything meaningful."""


class NotApplicable(Exception):  # noqa: N818 - reads as a result, not a failure
    """The code path this probe drives does not exist in this source (a ``n/a`` cell, not a bug)."""


BACKEND_SEPARATOR = ":"
"""A per-back-end field is ``<backend>:<field>`` (``nixl:failed.held``); the matrix declares ``<field>`` once."""

DEFAULT_BACKEND = "mooncake"
"""The transport a server uses unless told otherwise (``ServerArgs.disaggregation_transfer_backend``)."""

BACKEND_NOT_APPLICABLE = "not-applicable"
"""The field ``<backend>:not-applicable`` says why the build has no such back end, or none with the fix's machinery."""


def backend_field(backend: str, name: str) -> str:
    """The observation field ``name`` as seen on transport back end ``backend``."""
    return f"{backend}{BACKEND_SEPARATOR}{name}"


@dataclass
class Call:
    """One recorded call: positional and keyword arguments as given."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Recorder:
    """A callable that records its calls and returns a fixed value or runs a side effect."""

    def __init__(
        self,
        name: str,
        returns: Any = None,
        side_effect: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.returns = returns
        self.side_effect = side_effect
        self.calls: list[Call] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(Call(args, kwargs))
        if self.side_effect is not None:
            return self.side_effect(*args, **kwargs)
        return self.returns

    @property
    def count(self) -> int:
        return len(self.calls)

    def __repr__(self) -> str:
        return f"<Recorder {self.name} x{self.count}>"


def is_plain_callable(value: Any) -> bool:
    """A function, lambda, bound method or partial a probe wrote: what :meth:`Kit.guard` wraps."""
    return inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, functools.partial)


class StrictFake:
    """A stand-in for a GPU, transport or network collaborator.

    Only the attributes given at construction (or set later) exist; reading
    any other raises :class:`MissingFakeAttribute` naming it.
    """

    def __init__(self, kit: Kit, name: str, **attrs: Any) -> None:
        object.__setattr__(self, "_kit", kit)
        object.__setattr__(self, "_name", name)
        for key, value in attrs.items():
            setattr(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        # Every callable of a fake runs under the kit's guard: an exception inside it is
        # recorded before SGLang can swallow it (``_send_abort_ack`` logs such at debug level).
        if is_plain_callable(value):
            kit: Kit = object.__getattribute__(self, "_kit")
            value = kit.guard(value, f"{object.__getattribute__(self, '_name')}.{key}")
        object.__setattr__(self, key, value)

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        kit: Kit = object.__getattribute__(self, "_kit")
        name: str = object.__getattribute__(self, "_name")
        qualified = f"{name}.{item}"
        kit.missing_attributes.append(qualified)
        raise MissingFakeAttribute(f"fake {qualified} is not provided by the probe")

    def __repr__(self) -> str:
        return f"<fake {object.__getattribute__(self, '_name')}>"


@dataclass
class LoggedError:
    """An ERROR-or-worse log record emitted while the probe ran."""

    logger: str
    level: str
    message: str
    exc: str | None
    intended: str | None = None
    """What the scenario staged, when the record carries one of its intended failures."""

    def as_dict(self) -> dict[str, Any]:
        return {"logger": self.logger, "level": self.level, "message": self.message, "exc": self.exc}


# SGLang's PD code swallows exceptions at DEBUG level (``_send_abort_ack``,
# ``_send_abort_notification``); a record from there that carries an exception is a problem.
WATCHED_LOGGER = "sglang.srt.disaggregation"


class _Collector(logging.Handler):
    """ERROR-or-worse from every logger; any level from the PD code when it carries an exception."""

    def __init__(self, sink: list[LoggedError]) -> None:
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        carries = bool(record.exc_info and record.exc_info[1] is not None)
        watched = record.name == WATCHED_LOGGER or record.name.startswith(WATCHED_LOGGER + ".")
        if record.levelno < logging.ERROR and not (carries and watched):
            return
        exc, intended = None, None
        if record.exc_info and record.exc_info[1] is not None:
            exc = "".join(traceback.format_exception(*record.exc_info)).strip()
            intended = getattr(record.exc_info[1], "intended_failure", None)
        try:
            message = record.getMessage()
        except Exception:  # a malformed log call must not hide the record
            message = str(record.msg)
        self.sink.append(LoggedError(record.name, record.levelname, message, exc, intended))


class _Below(logging.Filter):
    """Drops PD records below the level they were shown at before the kit opened them up."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        watched = record.name == WATCHED_LOGGER or record.name.startswith(WATCHED_LOGGER + ".")
        return not (watched and record.levelno < self.threshold)


@dataclass
class Kit:
    """Handed to ``observe(kit)``; collects what the probe saw and what went wrong."""

    events: list[dict[str, Any]] = field(default_factory=list)
    missing_attributes: list[str] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)
    logged_errors: list[LoggedError] = field(default_factory=list)
    allowed_log_patterns: list[re.Pattern[str]] = field(default_factory=list)
    defaults: list[dict[str, Any]] = field(default_factory=list)
    """Attributes a harness-built object took from the build's own constructor code."""
    forced: list[dict[str, Any]] = field(default_factory=list)
    """Switches the probe forced, each with the build's own default for it."""
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    """Reads answered with AttributeError because the real object lacks the attribute as well."""
    intended_messages: list[str] = field(default_factory=list)
    """Messages of the failures the scenario staged that were raised (see :meth:`intended_failure`)."""
    _seen: set[tuple[str, str]] = field(default_factory=set, repr=False)
    """What :attr:`defaults`, :attr:`forced` and :attr:`fallbacks` already hold (a bench builds thousands alike)."""

    def _first(self, kind: str, entry: dict[str, Any]) -> bool:
        key = (kind, repr(sorted(entry.items())))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    # -- what SGLang is this? -------------------------------------------------
    @functools.cached_property
    def sglang_version(self) -> str:
        import sglang.version

        return str(sglang.version.__version__)

    def not_applicable(self, reason: str) -> None:
        """Stop: this source lacks the code path the probe is about (reported as ``n/a``)."""
        raise NotApplicable(reason)

    def on_backend(self, backend: str, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` observed on transport back end ``backend``, named as the lab reads them."""
        return {backend_field(backend, k): v for k, v in fields.items()}

    def backend_not_applicable(self, backend: str, reason: str) -> dict[str, Any]:
        """This build has no ``backend``, or none with the fix's machinery: the one field saying why."""
        return {backend_field(backend, BACKEND_NOT_APPLICABLE): reason}

    # -- fakes and recorders -------------------------------------------------
    def fake(self, name: str, **attrs: Any) -> StrictFake:
        """A strict fake collaborator with exactly ``attrs``."""
        return StrictFake(self, name, **attrs)

    def recorder(
        self,
        name: str,
        returns: Any = None,
        side_effect: Callable[..., Any] | None = None,
    ) -> Recorder:
        """A callable that counts calls; ``side_effect`` runs under :meth:`guard`."""
        if side_effect is not None:
            side_effect = self.guard(side_effect, name)
        return Recorder(name, returns, side_effect)

    def guard(self, fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
        """Wrap a fake's callable so any exception it raises is recorded before SGLang sees it."""
        label = name or getattr(fn, "__name__", repr(fn))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                staged = getattr(exc, "intended_failure", None)
                if staged:
                    self.event("intended_failure", where=label, what=staged, exception=f"{type(exc).__name__}: {exc}")
                    self.intended_messages.append(str(exc))
                elif not getattr(exc, "ends_scenario", False):
                    self.raised.append(f"{label}: {type(exc).__name__}: {exc}")
                raise

        return wrapper

    def intended_failure(self, what: str, base: type[Exception] = RuntimeError) -> type[Exception]:
        """An exception class for a failure the scenario stages on purpose inside a fake.

        ``what`` says what fails ("the transport refuses the abort"). Raised from a
        guarded fake, it is recorded as an ``intended_failure`` event, not as a
        problem: how SGLang handles it is the behaviour under test. It derives from
        ``base`` (default ``RuntimeError``), so SGLang's ``except`` clauses see the
        kind of error the real collaborator raises. Any other exception inside a
        fake stays a problem.
        """
        if not (isinstance(base, type) and issubclass(base, Exception)):
            raise TypeError(f"an intended failure derives from an Exception class, not {base!r}")
        return type(f"Intended{base.__name__}", (base,), {"intended_failure": what, "__module__": __name__})

    # -- what a harness-built object took from where ---------------------------
    def build_default(self, attribute: str, value: str, origin: str) -> None:
        """``attribute`` was not given by the probe; the build's constructor code gave ``value``."""
        entry = {"attribute": attribute, "value": value, "from": origin}
        if self._first("default", entry):
            self.defaults.append(entry)

    def forced_flag(self, attribute: str, value: Any, default: Any, origin: str, env: list[str]) -> None:
        """The probe set switch ``attribute`` to ``value``; this build would default it to ``default``."""
        if not isinstance(default, bool | int | float | str | type(None)):
            default = repr(default)
        entry = {"attribute": attribute, "value": value, "build_default": default, "from": origin, "env": env}
        if self._first("forced", entry):
            self.forced.append(entry)

    def fallback(self, attribute: str, why: str) -> None:
        """A read of ``attribute`` raised AttributeError on purpose (the real object lacks it too)."""
        entry = {"attribute": attribute, "why": why}
        if self._first("fallback", entry):
            self.fallbacks.append(entry)

    # -- events and logs -----------------------------------------------------
    def event(self, name: str, **data: Any) -> None:
        """Record a named lifecycle event (enqueued, sender created, ack sent...)."""
        self.events.append({"event": name, **data})

    def allow_log(self, pattern: str) -> None:
        """An ERROR log matching ``pattern`` is expected in this scenario (e.g. 'transfer failed').

        Allowing the same pattern again changes nothing (a bench allows it once per request).
        """
        if all(p.pattern != pattern for p in self.allowed_log_patterns):
            self.allowed_log_patterns.append(re.compile(pattern))

    @contextlib.contextmanager
    def capture_logs(self, open_pd_loggers: bool = True) -> Iterator[None]:
        """Collect ERROR records from every logger, and exception-carrying PD records at any level.

        The PD loggers are opened down to DEBUG while the body runs; the records
        this adds are kept out of the other handlers (the probe's log stays as it was).
        ``open_pd_loggers=False`` keeps their levels (a throughput bench times the
        path with the deployment's log levels); ERROR records are still collected.
        """
        handler = _Collector(self.logged_errors)
        root = logging.getLogger()
        if not open_pd_loggers:
            root.addHandler(handler)
            try:
                yield
            finally:
                root.removeHandler(handler)
            return
        watched = logging.getLogger(WATCHED_LOGGER)
        threshold = watched.getEffectiveLevel()
        quiet = _Below(threshold)
        loggers = [root, *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
        others = [h for lg in loggers for h in lg.handlers]
        for other in others:
            other.addFilter(quiet)
        saved_level = watched.level
        watched.setLevel(logging.DEBUG)
        root.addHandler(handler)
        try:
            yield
        finally:
            root.removeHandler(handler)
            watched.setLevel(saved_level)
            for other in others:
                other.removeFilter(quiet)

    def unexpected_logs(self) -> list[LoggedError]:
        """Logged errors that match no allowed pattern and report no failure the scenario staged.

        A build may word its own report of a staged failure (a fork's hand-port logs
        "ACME: sender abort failed" where upstream logs another sentence): a record
        carrying the staged exception, or quoting its message, is the behaviour under
        test, not a problem.
        """
        staged = [m for m in self.intended_messages if len(m) >= 12]
        out = []
        for rec in self.logged_errors:
            text = rec.message + "\n" + (rec.exc or "")
            if any(p.search(text) for p in self.allowed_log_patterns):
                continue
            if rec.intended or any(m in rec.message for m in staged):
                continue
            out.append(rec)
        return out

    def problems(self) -> list[str]:
        """Everything that makes this probe's observation untrustworthy."""
        found = [f"missing fake attribute: {m}" for m in dict.fromkeys(self.missing_attributes)]
        found += [f"exception raised inside a fake: {r}" for r in self.raised]
        found += [
            f"SGLang logged an error ({r.logger}): {r.message}" + (f"\n{r.exc}" if r.exc else "")
            for r in self.unexpected_logs()
        ]
        return found
