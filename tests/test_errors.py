"""The error contract: every error raised on purpose is a typed error of ``dali_alchemi.errors`` that also
inherits the builtin a caller would catch, and every one of them is exported."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import numpy as np
import pytest

import dali_alchemi
from dali_alchemi import errors

PACKAGE = Path(dali_alchemi.__file__).resolve().parent

BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)

# (module path under dali_alchemi/, enclosing function's qualified name, builtin raised) -> why it may stay.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("__init__.py", "__getattr__", "AttributeError"): (
        "module __getattr__ protocol (PEP 562): Python expects AttributeError for a missing name"
    ),
    ("batch.py", "Batch.__getattr__", "AttributeError"): (
        "attribute protocol: hasattr, getattr with a default, copy and pickle probe for AttributeError"
    ),
    ("bench/loaders.py", "_WindowedReads.read", "NotImplementedError"): (
        "abstract method of a base class, overridden by every subclass"
    ),
    ("testing/reader.py", "PackedReaderTests.make_reader", "NotImplementedError"): (
        "abstract hook of the reusable reader test suite, provided by each subclass"
    ),
    ("testing/reader.py", "PackedReaderTests.expected", "NotImplementedError"): (
        "abstract hook of the reusable reader test suite, provided by each subclass"
    ),
    ("pipeline/source.py", "WindowSource.read_window", "StopIteration"): (
        "iterator protocol: DALI's external source ends an epoch on StopIteration"
    ),
    ("pipeline/source.py", "ReadAheadSource.__call__", "StopIteration"): (
        "iterator protocol: DALI's external source ends an epoch on StopIteration"
    ),
    ("store/format/remote.py", "RetryingStore._retry", "AssertionError"): (
        "marks code after a retry loop that always returns or raises: a bug if reached, not an intended error"
    ),
}


def _bare_builtin_raises() -> list[tuple[str, int, str, str]]:
    """``(path, line, qualified function name, builtin)`` of every ``raise Builtin`` / ``raise Builtin(...)``."""
    found: list[tuple[str, int, str, str]] = []

    def visit(node: ast.AST, path: str, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, path, (*scope, child.name))
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN_EXCEPTIONS:
                    found.append((path, child.lineno, ".".join(scope), exc.id))
            visit(child, path, scope)

    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).as_posix()
        visit(ast.parse(file.read_text(), filename=str(file)), path, ())
    return found


def test_no_module_raises_a_bare_builtin_exception() -> None:
    raises = _bare_builtin_raises()
    bad = [
        f"dali_alchemi/{path}:{line}: raise {name} in {scope or '<module>'}"
        for path, line, scope, name in raises
        if (path, scope, name) not in ALLOWED
    ]
    assert not bad, "raise a typed error of dali_alchemi.errors instead of:\n" + "\n".join(bad)


def test_the_allow_list_has_no_stale_entries() -> None:
    used = {(path, scope, name) for path, _, scope, name in _bare_builtin_raises()}
    assert not set(ALLOWED) - used, sorted(set(ALLOWED) - used)
    assert all(reason.strip() for reason in ALLOWED.values())


def _classes() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value) and value.__module__ == errors.__name__
    }


def test_every_error_is_typed_and_inherits_a_builtin() -> None:
    classes = _classes()
    error_classes = {name: cls for name, cls in classes.items() if issubclass(cls, BaseException)}
    assert len(error_classes) == len(classes), "errors.py holds only exception and warning classes"
    for name, cls in error_classes.items():
        assert cls.__doc__ and cls.__doc__.strip(), f"{name} has no docstring"
        if issubclass(cls, Warning):
            assert issubclass(cls, errors.DaliAlchemiWarning), name
            continue
        assert issubclass(cls, errors.DaliAlchemiError), name
        if cls is errors.DaliAlchemiError:
            continue
        plain = (Exception, BaseException, object)
        builtin_bases = {base for base in cls.__mro__ if base.__module__ == "builtins" and base not in plain}
        assert builtin_bases, f"{name} inherits no builtin exception besides Exception"


def test_every_class_is_in_all_and_exported_by_the_package() -> None:
    classes = _classes()
    assert sorted(errors.__all__) == sorted(classes)
    assert len(set(errors.__all__)) == len(errors.__all__)
    for name, cls in classes.items():
        assert dali_alchemi._EXPORTS.get(name) == "dali_alchemi.errors", f"{name} missing from dali_alchemi._EXPORTS"
        assert name in dali_alchemi.__all__
        assert getattr(dali_alchemi, name) is cls


def test_an_empty_window_is_an_empty_batch_error_and_a_value_error() -> None:
    from dali_alchemi.batch import Batch

    with pytest.raises(errors.EmptyBatchError, match="Cannot create batch from empty data list") as info:
        Batch.from_samples([])
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, errors.DaliAlchemiError)


def test_a_truncated_blosc_frame_is_a_chunk_decode_error_and_a_value_error() -> None:
    from dali_alchemi.store.read.codecs import _CheckedBlosc

    with pytest.raises(errors.ChunkDecodeError, match="shorter than its 16-byte header") as info:
        _CheckedBlosc().decode(b"\x00" * 8)
    assert isinstance(info.value, ValueError)


def test_non_integer_indices_are_a_config_type_error_and_a_type_error() -> None:
    from dali_alchemi.store.format.indices import checked_indices

    with pytest.raises(errors.ConfigTypeError, match="Index values must be integers, got dtype float64") as info:
        checked_indices(np.array([0.5, 1.5]), 10)
    assert isinstance(info.value, TypeError)


# Raises sections that name a builtin because code outside this package raises it: nvalchemi's own
# validation, samplers and batch transforms, which the drop-in runs unchanged.
RAISED_BY_OTHERS: dict[tuple[str, str], frozenset[str]] = {
    ("nvalchemi/_atomic.py", "AtomicDataRules"): frozenset({"ValueError", "TypeError"}),
    ("nvalchemi/_dataloader.py", "DataLoader"): frozenset({"RuntimeError", "IndexError"}),
    ("nvalchemi/_dataset.py", "Dataset"): frozenset({"TypeError", "FileNotFoundError", "ValueError"}),
}


def _documented_raises() -> list[tuple[str, str, str]]:
    """``(path, qualified name, exception name)`` for each name in a numpydoc ``Raises`` section."""
    found: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, path: str, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = (*scope, child.name)
                doc = ast.get_docstring(child) or ""
                if "\nRaises\n------\n" in doc:
                    section = doc.split("\nRaises\n------\n", 1)[1]
                    lines = section.splitlines()
                    for line, after in zip(lines, [*lines[1:], ""], strict=True):
                        if not line.strip() or line.startswith(" "):
                            continue  # a blank line or a description
                        if after.startswith("---"):
                            break  # the next section's heading
                        found.extend((path, ".".join(inner), name.strip()) for name in line.split(","))
                visit(child, path, inner)

    for file in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(file.read_text(), filename=str(file)), file.relative_to(PACKAGE).as_posix(), ())
    return found


def test_docstrings_name_the_typed_errors_actually_raised() -> None:
    documented = _documented_raises()
    assert len(documented) > 50, "the Raises sections were not found"
    known = set(errors.__all__)
    bad = [
        f"dali_alchemi/{path}: {scope} documents {name}"
        for path, scope, name in documented
        if name in BUILTIN_EXCEPTIONS and name not in RAISED_BY_OTHERS.get((path, scope), frozenset())
    ]
    assert not bad, "name the typed error of dali_alchemi.errors that is raised:\n" + "\n".join(bad)
    unknown = [
        f"dali_alchemi/{path}: {scope} documents {name}"
        for path, scope, name in documented
        if name not in known and name not in BUILTIN_EXCEPTIONS and "." not in name
    ]
    assert not unknown, "a Raises section names an error that does not exist:\n" + "\n".join(unknown)
