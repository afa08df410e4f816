"""Meeting users where their data and models are: ASE files in, nvalchemi and PyTorch Geometric out.

Conversions of a :class:`~dali_alchemi.batch.Batch` to other frameworks live here, not on the Batch, so
the core never depends on them: ``to_pyg(batch)``, ``to_nvalchemi(batch)`` and ``to_ase(batch)``. The
optional packages (ase, nvalchemi-toolkit, torch_geometric) are imported only when a conversion runs.
"""

from __future__ import annotations

from dali_alchemi.interop.ase_io import batch_to_atoms as to_ase
from dali_alchemi.interop.frameworks import to_nvalchemi, to_pyg

__all__ = ["to_ase", "to_nvalchemi", "to_pyg"]
