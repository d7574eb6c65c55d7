"""Run one client call so that neither a wedged client nor a client's `sys.exit` takes the
in-process engine with it (without it a 1 s round-timeout took 20.3 s and `sys.exit(3)` in a
ClientApp ended the whole run; docs/robustness.md).

The call runs in this thread, as before (results stay bit-identical to Flower's), under a
SIGALRM deadline: at `timeout` seconds a `ClientTimedOut` is raised inside the client, wherever
it is in Python code, and the call is abandoned, as Flower abandons a reply later than the
round's timeout. `ClientTimedOut` derives from BaseException so a client's `except Exception`
cannot swallow it. Limits: a client blocked inside one C call (a torch kernel, a socket read
without timeout) is interrupted only when that call returns; `os._exit` cannot be contained in
a process; the deadline needs the main thread (elsewhere, as before, a late reply is dropped
after it arrives).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


class ClientTimedOut(BaseException):
    """The client call ran past its deadline and was interrupted."""


class ClientExited(RuntimeError):
    """The client called sys.exit; `code` is what it passed."""

    def __init__(self, code: object) -> None:
        super().__init__(f"client called sys.exit({code!r})")
        self.code = code


def can_interrupt() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise ClientTimedOut in this (main) thread after `seconds`; a no-op where impossible."""
    if seconds is None or not can_interrupt():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise ClientTimedOut()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)


def contained(call: Callable[[], T], timeout: float | None) -> T:
    """`call()` bounded by `timeout`; raises ClientTimedOut or ClientExited instead of hanging
    or exiting (KeyboardInterrupt still stops the engine)."""
    try:
        with deadline(timeout):
            return call()
    except SystemExit as stop:
        raise ClientExited(stop.code) from None
