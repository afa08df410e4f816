"""EpochFolderPlan: epochs drawn from a torch sampler in the training process, read by DALI's workers.

A sampler is drawn in the training process (it may use torch's global generator, and need not
pickle), but the DALI loader's worker processes read windows from the plan themselves. Before each
epoch, the loader records that epoch's :class:`~dali_alchemi.plan.EpochPlan` into a folder on shared
memory with :meth:`EpochFolderPlan.record`; the plan, pickled into the workers as just the folder's
path, reads it back there. An epoch is recorded before the pipeline asks for its first window (DALI
calls a parallel source for an epoch only when that epoch's first iteration runs), and a recorded
epoch never changes, so every process sees the same epoch. Only the latest epochs are kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dali_alchemi.errors import PlanError
from dali_alchemi.plan.base import EpochPlan

__all__ = ["KEPT_EPOCHS", "EpochFolderPlan"]


KEPT_EPOCHS = 2
"""Recorded epochs kept in the folder: the one being read and the one before it (a worker may still be
finishing it)."""


@dataclass(frozen=True, slots=True)
class EpochFolderPlan:
    """The epochs recorded in ``folder`` for a reader of ``num_samples`` structures."""

    folder: str
    num_samples: int

    def _path(self, epoch: int) -> Path:
        return Path(self.folder) / f"epoch-{epoch}.npz"

    def record(self, plan: EpochPlan) -> None:
        """Write ``plan`` as its epoch (atomically: a reader sees all of it or nothing) and drop old epochs."""
        path = self._path(plan.epoch)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, order=plan.order, batch_ptr=plan.batch_ptr)
        os.replace(partial, path)
        stale = self._path(plan.epoch - KEPT_EPOCHS)
        stale.unlink(missing_ok=True)

    def epoch(self, epoch: int) -> EpochPlan:
        """The recorded epoch ``epoch``.

        Raises
        ------
        PlanError
            If that epoch was never recorded (or is long gone).
        """
        try:
            with np.load(self._path(epoch)) as saved:
                return EpochPlan(epoch=epoch, order=saved["order"], batch_ptr=saved["batch_ptr"])
        except FileNotFoundError:
            raise PlanError(f"epoch {epoch} was not recorded from the sampler (in {self.folder})") from None

    def to_dict(self) -> dict[str, Any]:
        """The plan's identity: each epoch is whatever the sampler yielded."""
        return {"kind": "sampler", "num_samples": self.num_samples}
