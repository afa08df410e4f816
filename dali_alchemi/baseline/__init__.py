"""The plain ``torch.utils.data.DataLoader`` as people use it today, over the same reader and Batch.

It exists so anyone can rerun the comparison; it must not import DALI.
"""

from dali_alchemi.baseline.torch_loader import plain_dataloader

__all__ = ["plain_dataloader"]
