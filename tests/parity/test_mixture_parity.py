"""MixturePlan against nvalchemi 0.2.0's MultiDatasetBatchSampler and MultiDatasetSampler.

Without shuffling both sides are deterministic, so the batches must be identical, sharded or not; with
shuffling the random draws differ (torch's generator against numpy's), and the epoch's length and the
structures drawn from each dataset must still agree. Runs only where nvalchemi is importable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dali_alchemi import MixturePlan
from dali_alchemi.bench.synth import write_synthetic_store

samplers = pytest.importorskip("nvalchemi.data.datapipes.samplers", reason="nvalchemi-toolkit is not installed")
from nvalchemi.data.datapipes.backends.zarr import AtomicDataZarrReader  # noqa: E402
from nvalchemi.data.datapipes.dataset import Dataset  # noqa: E402
from nvalchemi.data.datapipes.multidataset import MultiDataset  # noqa: E402

LENGTHS = (50, 23)
MIXES: list[dict[str, Any]] = [{}, {"weights": (1, 1)}, {"weights": (1, 4)}, {"samples_per_dataset": (5, 3)}]
POLICIES = ["dataset_size", "min_size", "max_size"]


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """nvalchemi's own MultiDataset over two stores (its Dataset over its reader)."""
    root = tmp_path_factory.mktemp("mixture")
    paths = [
        write_synthetic_store(root / f"{d}.zarr", n, seed=d, min_atoms=3, max_atoms=8) for d, n in enumerate(LENGTHS)
    ]
    dataset = MultiDataset(*(Dataset(AtomicDataZarrReader(str(p))) for p in paths))
    assert [len(d) for d in dataset.datasets] == list(LENGTHS)
    yield dataset
    dataset.close()


def _both(multi: Any, shuffle: bool, **options: Any) -> tuple[Any, Any]:
    """(nvalchemi's batches or error text, ours) for one set of batch-sampler options."""
    shard = {"shard_id": options.pop("rank", 0), "num_shards": options.pop("num_replicas", 1)}
    try:
        theirs: Any = list(
            samplers.MultiDatasetBatchSampler(
                multi, shuffle=shuffle, rank=shard["shard_id"], num_replicas=shard["num_shards"], **options
            )
        )
    except ValueError as err:
        theirs = str(err)
    try:
        plan = MixturePlan(lengths=LENGTHS, shuffle=shuffle, **shard, **options)
        ours: Any = [b.tolist() for b in plan.epoch(0).batches()]
    except ValueError as err:
        ours = str(err)
    return theirs, ours


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("policy", POLICIES)
def test_unshuffled_batches_are_nvalchemis_batches(multi: Any, policy: str, replacement: bool) -> None:
    for mix in MIXES:
        theirs, ours = _both(multi, False, batch_size=8, epoch_policy=policy, replacement=replacement, **mix)
        assert ours == theirs, mix  # the same batches, or the same refusal


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shards", [2, 3])
def test_unshuffled_shards_are_nvalchemis_shards(multi: Any, shards: int, drop_last: bool) -> None:
    for rank in range(shards):
        theirs, ours = _both(
            multi, False, batch_size=8, weights=(1, 1), epoch_policy="max_size", num_replicas=shards, rank=rank,
            drop_last=drop_last,
        )  # fmt: skip
        assert isinstance(theirs, list) and ours == theirs


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("policy", POLICIES)
def test_shuffled_epochs_draw_what_nvalchemi_draws_from_each_dataset(
    multi: Any, policy: str, replacement: bool
) -> None:
    for mix in MIXES:
        for epoch in range(2):
            options = {"batch_size": 8, "epoch_policy": policy, "replacement": replacement, "seed": 3, **mix}
            try:
                sampler = samplers.MultiDatasetBatchSampler(multi, **options)
            except ValueError:
                with pytest.raises(ValueError):
                    MixturePlan(lengths=LENGTHS, **options)
                continue
            sampler.set_epoch(epoch)
            theirs = list(sampler)
            ours = [b.tolist() for b in MixturePlan(lengths=LENGTHS, **options).epoch(epoch).batches()]
            assert len(ours) == len(theirs), (mix, epoch)
            composition = {(sum(i < LENGTHS[0] for i in b), sum(i >= LENGTHS[0] for i in b)) for b in theirs + ours}
            assert len(composition) == 1, (mix, composition)  # every batch of both: the same counts per dataset
            if not replacement:
                drawn = np.concatenate(ours)
                assert np.unique(drawn).size == drawn.size


@pytest.mark.parametrize("replacement", [True, False])
def test_the_sample_mix_is_nvalchemis_multi_dataset_sampler(multi: Any, replacement: bool) -> None:
    for weights in [None, (1, 1), (3, 1)]:
        try:
            theirs: Any = list(
                samplers.MultiDatasetSampler(multi, weights=weights, replacement=replacement, shuffle=False)
            )
        except ValueError as err:
            theirs = str(err)
        try:
            plan = MixturePlan(
                lengths=LENGTHS, batch_size=8, weights=weights, replacement=replacement, mix="sample", shuffle=False
            )
            ours: Any = plan.epoch(0).order[: plan.epoch(0).batch_ptr[-1]].tolist()
        except ValueError as err:
            ours = str(err)
        assert ours == theirs, weights
        if replacement is False and isinstance(theirs, list):  # shuffled: the draws per dataset still agree
            shuffled = list(samplers.MultiDatasetSampler(multi, weights=weights, replacement=False, seed=4))
            plan = MixturePlan(lengths=LENGTHS, batch_size=8, weights=weights, replacement=False, mix="sample", seed=4)
            mine = plan.epoch(0).order
            assert (
                np.bincount(np.asarray(mine) >= LENGTHS[0]).tolist()
                == np.bincount(np.asarray(shuffled) >= LENGTHS[0]).tolist()
            )
