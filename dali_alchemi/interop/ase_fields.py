"""What one ``ase.Atoms`` holds, as named arrays with a level: the per-structure half of ``convert``.

Everything numeric is kept, in its own dtype (float64 for what ASE computes); the conversion decides
dtypes later, once per chunk. Sources, in order of precedence when two give the same name:

- the structure itself: ``atomic_numbers``, ``positions``, ``atomic_masses``, ``cell``, ``pbc``;
- the calculator's results (``atoms.calc.results``): ``energy``, ``forces``, ``stress`` (3x3),
  ``dipole``, ``charges`` map onto nvalchemi's fields; every other result keeps its ASE name
  (``free_energy``, ``magmom``, per-atom ``energies``, ``magmoms``, ``stresses`` (3x3 per atom), ...);
- per-atom arrays (``atoms.arrays``): ``momenta`` and ``charges`` map onto nvalchemi's fields, the
  rest (``initial_magmoms``, ``initial_charges``, ``tags``, ...) keep their names;
- per-structure values (``atoms.info``), with an ASE database row's key-value pairs and data
  (``info["key_value_pairs"]``, ``info["data"]``) flattened into it: ``energy``, ``stress``,
  ``virial``, ``dipole`` map onto nvalchemi's fields when no result gave them, the rest keep their names.

A key whose value is not numeric (a string, an object) is dropped with the reason; so is a name that
an earlier source already gave (reported as ``"name (source)"``, since the stored field keeps the name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import SampleDataError
from dali_alchemi.interop.neighbors import radius_graph

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ase import Atoms
    from numpy.typing import NDArray

    from dali_alchemi.types import Level

__all__ = [
    "ARRAY_NAMES", "COLUMNS", "HANDLED_ARRAYS", "NESTED_INFO", "PER_ATOM_RESULTS", "RANK2", "RESULT_NAMES",
    "Extracted", "extract", "field_notes", "rank2", "system_row"
]  # fmt: skip


# Calculator results that hold one row per atom (ASE's per-atom properties); any other result with
# a leading dim equal to the atom count is taken per atom too, and the rest per structure.
PER_ATOM_RESULTS = frozenset({"forces", "stresses", "charges", "magmoms", "energies", "born_effective_charges"})
# Names of results and arrays that become nvalchemi fields of another name (or the same one).
RESULT_NAMES = {"energy": "energy", "forces": "forces", "stress": "stress", "dipole": "dipole", "charges": "charges"}
ARRAY_NAMES = {"momenta": "momenta", "charges": "charges"}
# Keys the structure itself provides, or that describe an ASE database row rather than hold data.
HANDLED_ARRAYS = frozenset({"numbers", "positions", "masses"})
NESTED_INFO = ("key_value_pairs", "data")
RANK2 = frozenset({"stress", "virial"})
COLUMNS = frozenset({"energy", "charge", "spin"})


@dataclass(frozen=True, slots=True)
class Extracted:
    """One structure: ``fields`` maps a name to its level and values (``[V, ...]`` atom, ``[E, ...]``
    edge, ``[1, ...]`` system), ``dropped`` maps each key that could not be kept to why."""

    fields: dict[str, tuple[Level, NDArray[Any]]]
    dropped: dict[str, str]
    n_atoms: int
    n_edges: int


def _numeric(value: Any) -> NDArray[Any] | None:
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # ragged lists
        return None
    return arr if arr.dtype.kind in "biuf" else None


def _why_not(value: Any) -> str:
    return f"not numeric ({type(value).__name__})"


_VOIGT_TO_3X3 = np.array([0, 5, 4, 5, 1, 3, 4, 3, 2])


def rank2(value: Any, rows: int, *, what: str) -> NDArray[Any]:
    """``rows`` stress-like values as ``[rows, 3, 3]``: 9 entries each, or 6 in Voigt order
    (xx, yy, zz, yz, xz, xy)."""
    arr = np.asarray(value, dtype=np.float64).reshape(rows, -1)
    if arr.shape[1] == 9:
        return arr.reshape(rows, 3, 3)
    if arr.shape[1] == 6:
        return arr[:, _VOIGT_TO_3X3].reshape(rows, 3, 3)
    raise SampleDataError(f"{what} must have 6 (Voigt) or 9 entries per row, got {arr.shape[1]}")


def system_row(name: str, arr: NDArray[Any]) -> NDArray[Any]:
    """A per-structure value as one system row, in nvalchemi's shapes for its own fields: ``[1, 1]``
    for energy, charge and spin, ``[1, 3]`` for dipole, ``[1, 3, 3]`` for stress and virial."""
    if name in RANK2:
        return rank2(arr, 1, what=name)
    if name in COLUMNS:
        return arr.reshape(1, 1)
    if name == "dipole":
        return arr.reshape(1, -1)
    return arr[None]


def extract(atoms: Atoms, *, cutoff: float | None = None) -> Extracted:
    """Every numeric value of one structure under its field name, with its level (see the module doc)."""
    n = len(atoms)
    fields: dict[str, tuple[Level, NDArray[Any]]] = {
        "atomic_numbers": ("atom", np.asarray(atoms.numbers, dtype=np.int64)),
        "positions": ("atom", np.asarray(atoms.positions)),
        "atomic_masses": ("atom", np.asarray(atoms.get_masses())),
        "cell": ("system", np.asarray(atoms.cell.array)[None]),
        "pbc": ("system", np.asarray(atoms.pbc, dtype=np.bool_)[None]),
    }
    dropped: dict[str, str] = {}

    def put(name: str, level: Level, value: NDArray[Any], source: str) -> None:
        if name in fields:  # reported under its source, since the stored field keeps the name
            dropped[f"{name} ({source})"] = f"{name!r} was already given by the structure or its calculator"
        else:
            fields[name] = (level, value)

    results: dict[str, Any] = dict(atoms.calc.results) if atoms.calc is not None else {}
    for key, value in results.items():
        arr = _numeric(value)
        if arr is None:
            dropped[key] = _why_not(value)
            continue
        name = RESULT_NAMES.get(key, str(key))
        try:
            if key in PER_ATOM_RESULTS or (key not in RESULT_NAMES and arr.ndim >= 1 and arr.shape[0] == n):
                arr = rank2(arr, n, what=f"result {key!r}") if key == "stresses" else arr.reshape(n, *arr.shape[1:])
                put(name, "atom", arr, "result")
            else:
                put(name, "system", system_row(name, arr), "result")
        except ValueError:
            dropped[key] = f"result of shape {arr.shape}, which does not fit {name!r}"
    for key, value in atoms.arrays.items():
        if key in HANDLED_ARRAYS:
            continue
        arr = _numeric(value)
        if arr is None or arr.shape[:1] != (n,):
            dropped[key] = _why_not(value) if arr is None else f"per-atom array with shape {arr.shape}"
            continue
        put(ARRAY_NAMES.get(key, key), "atom", arr, "arrays")
    info = dict(atoms.info)
    for nested in NESTED_INFO:
        if isinstance(info.get(nested), dict):
            for key, value in info.pop(nested).items():
                if key in info:
                    dropped[f"{key} ({nested})"] = f"{key!r} is also a key of atoms.info"
                else:
                    info[key] = value
    for key, value in info.items():
        arr = _numeric(value)
        if arr is None:
            dropped[key] = _why_not(value)
            continue
        try:
            put(key, "system", system_row(key, arr), "info")
        except ValueError:
            dropped[key] = f"info value of shape {arr.shape}, which does not fit {key!r}"
    n_edges = 0
    if cutoff is not None:
        cell = np.asarray(atoms.cell.array, dtype=np.float64)
        edges, images = radius_graph(atoms.positions, cell, atoms.pbc, cutoff)
        fields["neighbor_list"] = ("edge", edges)
        fields["neighbor_list_shifts"] = ("edge", images)
        fields["shifts"] = ("edge", images.astype(np.float64) @ cell)
        n_edges = len(edges)
    return Extracted(fields=fields, dropped=dropped, n_atoms=n, n_edges=n_edges)


def field_notes(fields: Iterable[str], *, cutoff: float | None = None) -> list[str]:
    """Why a conversion stored fields the input did not name as such: one line for each, among ``fields``.

    ``atomic_masses`` is stored for every structure: ASE's masses (the input's own, else each element's
    standard mass), as nvalchemi's ``AtomicData.from_atoms`` stores them. ``momenta`` is how ASE keeps
    velocities. A ``cutoff`` adds the neighbor list with each edge's periodic image in both of
    nvalchemi's forms: ``neighbor_list_shifts``, integer cell offsets (what nvalchemi's models and its
    neighbor-list hook read), and ``shifts``, the same offsets in Å (``neighbor_list_shifts @ cell``,
    for models that add them to position differences).
    """
    present = set(fields)
    lines = []
    if "atomic_masses" in present:
        lines.append(
            "added atomic_masses: ASE's masses (the input's own, else each element's standard mass), "
            "as nvalchemi's AtomicData.from_atoms stores them"
        )
    if "momenta" in present:
        lines.append("kept momenta: the input's velocities as ASE holds them (masses x velocities), nvalchemi's field")
    if cutoff is not None and {"neighbor_list", "neighbor_list_shifts", "shifts"} <= present:
        lines.append(
            f"added neighbor_list (atom pairs within {cutoff:g} Å) with each pair's periodic image in both of "
            "nvalchemi's forms: neighbor_list_shifts (int64 cell offsets, what its models read) and shifts "
            "(the same in Å, neighbor_list_shifts @ cell)"
        )
    return lines
