"""A mistyped keyword names the class and the keyword meant, as a ConfigTypeError (still a TypeError)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from dali_alchemi.config import LoaderConfig
from dali_alchemi.errors import ConfigTypeError
from dali_alchemi.keywords import checks_keywords


@checks_keywords({"prefetch_factor": "'batches_per_window' (nvalchemi's prefetch_factor)"})
class Loader:
    def __init__(self, source: str, *, batch_size: int = 1, num_workers: int = 0) -> None:
        self.source, self.batch_size, self.num_workers = source, batch_size, num_workers


@checks_keywords()
def build(*, seed: int = 0, shuffle: bool = True) -> tuple[int, bool]:
    return seed, shuffle


def test_a_close_keyword_is_named() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"^Loader got an unexpected keyword argument 'batchsize'; did you mean 'batch_size'\?$"
    ):
        Loader("s", batchsize=64)
    with pytest.raises(
        TypeError, match=r"^build\(\) got an unexpected keyword argument 'shufle'; did you mean 'shuffle'\?$"
    ):
        build(shufle=False)


def test_a_hint_names_what_another_library_calls_it_and_no_match_lists_every_keyword() -> None:
    with pytest.raises(ConfigTypeError, match=r"'prefetch_factor'; did you mean 'batches_per_window' \(nvalchemi's"):
        Loader("s", prefetch_factor=2)
    with pytest.raises(ConfigTypeError, match=r"'colour'; it takes source, batch_size, num_workers$"):
        Loader("s", colour="red")


def test_the_callable_is_unchanged_otherwise() -> None:
    loader = Loader("s", batch_size=3)
    assert (loader.source, loader.batch_size, loader.num_workers) == ("s", 3, 0)
    assert build(seed=2) == (2, True)
    assert list(inspect.signature(Loader).parameters) == ["source", "batch_size", "num_workers"]
    assert list(inspect.signature(build).parameters) == ["seed", "shuffle"]
    with pytest.raises(TypeError, match="positional"):  # Python's own errors for everything else
        build(1)

    def anything(**options: Any) -> dict[str, Any]:
        return options

    assert checks_keywords()(anything) is anything  # it takes any keyword: nothing to check


def test_a_frozen_dataclass_is_checked() -> None:
    @checks_keywords()
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Settings:
        depth: int = 2

    assert Settings(depth=3).depth == 3
    with pytest.raises(
        ConfigTypeError, match=r"Settings got an unexpected keyword argument 'dept'; did you mean 'depth'\?"
    ):
        Settings(dept=3)
    with pytest.raises(
        ConfigTypeError,
        match=r"^LoaderConfig got an unexpected keyword argument 'num_worker'; did you mean 'num_workers'\?$",
    ):
        LoaderConfig(num_worker=2)
