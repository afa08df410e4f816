"""The runner-to-consumer hand-off: bounded, and intact after an interrupt at any point of a get."""

from __future__ import annotations

import functools
import queue
import sys
import threading
from types import FrameType
from typing import Any

import pytest

from dali_alchemi.pipeline.iterator import Handoff


def test_handoff_holds_capacity_items_and_hands_them_over_in_order() -> None:
    handoff = Handoff(capacity=2)
    assert handoff.put("a", timeout=0.01)
    assert handoff.put("b", timeout=0.01)
    assert not handoff.put("c", timeout=0.01)  # full: the runner waits and checks its stop flag
    assert handoff.get(timeout=0.01) == "a"
    assert handoff.put("c", timeout=0.01)
    assert [handoff.get(timeout=0.01), handoff.get(timeout=0.01)] == ["b", "c"]
    with pytest.raises(queue.Empty):
        handoff.get(timeout=0.01)


def test_drain_frees_every_slot() -> None:
    handoff = Handoff(capacity=2)
    handoff.put("a", timeout=0.01)
    handoff.put("b", timeout=0.01)
    handoff.drain()
    with pytest.raises(queue.Empty):
        handoff.get(timeout=0.01)
    assert handoff.put("c", timeout=0.01) and handoff.put("d", timeout=0.01)


def _get_interrupted_at(handoff: Handoff, line: int) -> tuple[str, Any]:
    """``handoff.get`` with a KeyboardInterrupt raised at its ``line``-th traced line, in this or any callee."""
    seen = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == line:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        return "got", handoff.get(timeout=0.01)
    except KeyboardInterrupt:
        return "interrupted", None
    finally:
        sys.settrace(None)


def _in_thread(work: Any, timeout: float = 5.0) -> Any:
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(work()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "the hand-off deadlocked"
    return results[0]


def test_an_interrupt_anywhere_in_a_get_leaves_the_handoff_usable() -> None:
    """Ctrl-C lands between any two bytecodes of the consumer. Wherever it lands inside ``get``, the
    drain on the way out and later hand-offs neither deadlock nor raise (``queue.Queue`` fails this:
    an interrupt inside its ``with self.not_empty`` leaves its mutex held or released twice)."""
    line = 0
    while True:
        line += 1
        handoff = Handoff(capacity=2)
        handoff.put("a", timeout=0.01)
        outcome, item = _in_thread(functools.partial(_get_interrupted_at, handoff, line))
        _in_thread(handoff.drain)
        put = functools.partial(handoff.put, "b", timeout=0.01)
        assert _in_thread(put), f"no free slot after an interrupt at line {line}"
        assert _in_thread(functools.partial(handoff.get, timeout=0.01)) == "b"
        if outcome == "got":  # the interrupt came after the last line: every point was tried
            assert item == "a"
            break
    assert line > 2
