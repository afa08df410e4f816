"""Dataset: nvalchemi 0.2.0's ``Dataset``, also opened from a store path, over this project's reader.

It *is* nvalchemi's ``Dataset`` (a subclass that changes no behaviour), so everything that accepts
one (``MultiDataset``, nvalchemi's own ``DataLoader``, its hooks) accepts it, and ``ds[i]``,
``load_batches`` and the prefetch API work as nvalchemi documents them. The one addition: a store
(path, URL, zarr ``Store``) may be given in place of a reader, and is then opened with
:class:`~dali_alchemi.nvalchemi.AtomicDataZarrReader` (this project's packed reader with nvalchemi's
reader contract), which :class:`~dali_alchemi.nvalchemi.DataLoader` reads at full speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nvalchemi.data.datapipes import Dataset as _NvDataset

from dali_alchemi.config import DEFAULT_NUM_WORKERS
from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader
from dali_alchemi.keywords import checks_keywords

if TYPE_CHECKING:
    import torch

__all__ = ["Dataset"]


@checks_keywords()
class Dataset(_NvDataset):  # type: ignore[misc]  # nvalchemi is untyped here
    """nvalchemi's ``Dataset(reader, *, device=None, num_workers=2, skip_validation=False, transforms=None)``.

    Parameters
    ----------
    reader
        A reader (this project's, nvalchemi's, or any with nvalchemi's reader contract), or a store
        (``str``/``os.PathLike`` path, URL or zarr ``Store``), opened with
        :class:`~dali_alchemi.nvalchemi.AtomicDataZarrReader`.
    device, num_workers, skip_validation, transforms
        nvalchemi's, with its defaults and meaning (``device=None``: CUDA when available).

    Raises
    ------
    TypeError
        As nvalchemi's: for a reader without the reader interface, or ``transforms`` that is not a sequence.
    ConfigTypeError
        For a keyword it does not take (a ``TypeError``, as nvalchemi's), naming the keyword meant.
    FileNotFoundError, ValueError
        For a store path that does not exist or is not an nvalchemi store (nvalchemi's messages).
    """

    def __init__(
        self,
        reader: Any,
        *,
        device: str | torch.device | None = None,
        num_workers: int = DEFAULT_NUM_WORKERS,
        skip_validation: bool = False,
        transforms: Sequence[Any] | None = None,
    ) -> None:
        if not (hasattr(reader, "read_many") or hasattr(reader, "_load_sample")):
            reader = NvalchemiDropInReader(reader)
        super().__init__(
            reader, device=device, num_workers=num_workers, skip_validation=skip_validation, transforms=transforms
        )
