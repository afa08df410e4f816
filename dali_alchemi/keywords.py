"""A mistyped keyword argument names the one that was meant: ``batchsize`` -> ``batch_size``.

Python's own error for an unknown keyword (``__init__() got an unexpected keyword argument``) names
neither the class nor the keywords it takes. :func:`checks_keywords` wraps a class's ``__init__`` (or a
function) so that an unknown keyword raises :class:`~dali_alchemi.errors.ConfigTypeError` (still a
``TypeError``) naming the class and the closest keyword it takes, found with :mod:`difflib`, or, with
none close, every keyword it takes. Keywords another library uses for the same thing (nvalchemi's or
torch's) can be given as ``hints``. The check runs once per call, before the call: nothing on a read path.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dali_alchemi.errors import ConfigTypeError

__all__ = ["checks_keywords", "unexpected_keyword"]

Wrapped = TypeVar("Wrapped", bound=Callable[..., Any])

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keyword(owner: str, keyword: str, accepted: list[str], hints: Mapping[str, str] | None = None) -> str:
    """The message for ``keyword``, which ``owner`` does not take: the closest of ``accepted``, or all of them."""
    message = f"{owner} got an unexpected keyword argument {keyword!r}"
    if hints and keyword in hints:
        return f"{message}; did you mean {hints[keyword]}?"
    close = difflib.get_close_matches(keyword, accepted, n=1, cutoff=0.6)
    if close:
        return f"{message}; did you mean {close[0]!r}?"
    return f"{message}; it takes {', '.join(accepted)}"


def _checked(function: Wrapped, owner: str, hints: Mapping[str, str] | None) -> Wrapped:
    parameters = list(inspect.signature(function).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return function  # it takes any keyword
    accepted = [p.name for p in parameters if p.kind in _NAMED and p.name != "self"]
    known = frozenset(accepted)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        for keyword in kwargs:
            if keyword not in known:
                raise ConfigTypeError(unexpected_keyword(owner, keyword, accepted, hints))
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]


def checks_keywords(hints: Mapping[str, str] | None = None) -> Callable[[Wrapped], Wrapped]:
    """Decorate a class (its ``__init__`` is checked) or a function to refuse unknown keywords clearly.

    ``hints`` maps keywords the callable does not take to what to say instead (``{"prefetch_factor":
    "'batches_per_window' (nvalchemi's prefetch_factor)"}``). The signature stays the callable's own.

    Raises
    ------
    ConfigTypeError
        From the decorated callable, for a keyword it does not take (a ``TypeError``), naming the
        callable and the keyword meant.
    """

    def decorate(target: Wrapped) -> Wrapped:
        if isinstance(target, type):
            target.__init__ = _checked(target.__init__, target.__name__, hints)  # type: ignore[misc]
            return target
        return _checked(target, f"{target.__name__}()", hints)

    return decorate
