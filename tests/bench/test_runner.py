"""The benchmark runner: records, ratios, JSON and the plot, on a tiny store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dali_alchemi import AtomicDataZarrReader, ConfigError, PlanError
from dali_alchemi.bench.loaders import (
    LoaderSettings,
    _dali_read_many,
    _ReadManyOnly,
    bench_plan,
    open_loader,
    validate_names,
)
from dali_alchemi.bench.runner import BenchConfig, measure, run_bench
from dali_alchemi.cli import main
from dali_alchemi.interop.read_many import ReadManyAdapter

KEYS = {
    "loader",
    "order",
    "batch_size",
    "samples_per_s",
    "atoms_per_s",
    "ratio_vs_plain",
    "first_batch_s",
    "peak_pss_mb",
    "start_pss_mb",
    "processes",
    "shuffle_quality",
    "batch_energy_ks",
    "wait_s",
}
META = {"config", "store", "machine", "versions"}


def test_run_bench_records(small_store: Path) -> None:
    config = BenchConfig(
        loaders=("dali-w0", "torch-batched-w0", "packed", "packed-sequential", "limit"),
        orders=("shuffle",),
        rounds=1,
        epochs=2,
        batch_size=32,
    )
    run = run_bench(str(small_store), config)
    by_name = {r.loader: r for r in run.records}
    assert set(by_name) == {"dali-w0", "torch-batched-w0", "packed", "packed-sequential", "limit", "page-cache"}
    assert by_name["torch-batched-w0"].ratio_vs_plain == pytest.approx(1.0)
    assert by_name["packed-sequential"].order == by_name["limit"].order == "sequential"
    limit = by_name["limit"].samples_per_s
    for record in run.records:
        data = record.to_dict()
        assert KEYS <= set(data) and data["samples_per_s"] > 0 and data["warm_samples_per_s"] > 0
        assert not META & set(data), "the run's metadata is not repeated in each record"
        if record.loader in ("limit", "page-cache"):  # no loader ran: no first batch, memory or share
            assert record.first_batch_s is None and record.peak_pss_mb is None and record.share_of_limit is None
            assert record.shuffle_quality is None and record.total_s > 0  # type: ignore[operator]
        else:
            assert record.share_of_limit == pytest.approx(data["samples_per_s"] / limit)
            assert record.warm_share_of_limit == pytest.approx(data["warm_samples_per_s"] / limit)
    figures = run.meta.store["limit"]
    assert figures["structures"] == run.meta.store["structures"] and figures["arrays"]
    assert figures["structures_per_s"] == pytest.approx(
        figures["structures"] / (figures["decode_s"] + figures["crc32c_s"])
    )
    meta = run.meta.to_dict()
    assert set(meta) == META
    assert meta["machine"]["cpus"] >= 1 and "torch" in meta["versions"] and meta["store"]["open_s"] > 0
    assert meta["config"]["loaders"] == list(config.loaders) and meta["store"]["path"] == str(small_store)


def test_cli_bench_writes_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", "--n", "300", "--rounds", "1", "--epochs", "1", "--loaders", "dali-w0,torch-w0,nvalchemi,limit",
                 "--step-ms", "1", "--json", str(out), "--plot", str(png)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert set(data) == {"meta", "records"} and set(data["meta"]) == META
    records = data["records"]
    assert {r["loader"] for r in records} == {"dali-w0", "torch-w0", "nvalchemi", "limit", "page-cache"}
    assert all(KEYS <= set(r) and not META & set(r) for r in records)
    text = out.read_text()
    assert text.count('"machine"') == 1 and text.count('"versions"') == 1 and text.count('"write_config"') == 1
    assert data["meta"]["store"]["synthetic"] and data["meta"]["store"]["structures"] == 300
    assert data["meta"]["config"]["step_ms"] == 1 and data["meta"]["machine"]["cpus"] >= 1
    by_name = {r["loader"]: r for r in records}
    for name in ("dali-w0", "torch-w0"):
        record = by_name[name]
        assert record["samples_per_s"] > 0 and record["atoms_per_s"] > 0 and record["first_batch_s"] > 0
        assert record["rounds"] == 1 and record["batch_size"] == 64 and record["epoch_vs_steps"] >= 1
    assert by_name["torch-w0"]["ratio_vs_plain"] == pytest.approx(1.0)
    assert by_name["nvalchemi"]["note"] == "not installed" or by_name["nvalchemi"]["samples_per_s"] > 0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    assert "structures/s" in text and "epoch / steps" in text
    assert "1 epoch, 1 round" in text and "median of" not in text  # one measurement is not a median


def test_unknown_loaders_and_orders_are_rejected() -> None:
    with pytest.raises(ValueError, match="Unknown loader 'dali-fast'"):
        validate_names(["dali", "dali-fast"])
    with pytest.raises(ConfigError, match=r"'decode' is now 'packed-sequential'.*'limit' row"):
        validate_names(["packed", "decode"])
    validate_names(["packed-sequential", "limit"])
    with pytest.raises(ValueError, match="Unknown order 'random'"):
        BenchConfig(loaders=("dali",), orders=("random",))


def test_budget_runs_report_batches_and_fill(small_store: Path) -> None:
    config = BenchConfig(
        loaders=("dali-w0", "torch-batched-w0", "pyg-dynamic-w0", "packed", "nvalchemi"),
        rounds=1, epochs=1, max_atoms=600,
    )  # fmt: skip
    by_name = {r.loader: r for r in run_bench(str(small_store), config).records}
    dali, plain, pyg = by_name["dali-w0"], by_name["torch-batched-w0"], by_name["pyg-dynamic-w0"]
    assert dali.batches_per_epoch == plain.batches_per_epoch  # the same plan, so the same batches
    assert dali.atoms_per_batch is not None and dali.atoms_per_batch <= 600
    assert dali.fill_ratio == pytest.approx(dali.atoms_per_batch / 600) and 0.8 < dali.fill_ratio <= 1.0
    assert pyg.fill_ratio is not None and pyg.batches_per_epoch is not None
    assert by_name["packed"].fill_ratio is None  # windows, not batches
    assert by_name["nvalchemi"].note in ("no atom budget", "not installed")


def test_orders_carry_their_shuffle_quality_and_batch_ks(small_store: Path) -> None:
    config = BenchConfig(
        loaders=("dali-w2-shared", "packed", "packed-sequential", "nvalchemi"), orders=("block", "shuffle", "sequential"),
        rounds=1, epochs=1, batch_size=16, cache_bytes=64 << 10,
    )  # fmt: skip
    records = {(r.loader, r.order): r for r in run_bench(str(small_store), config).records}
    assert set(records) == {(n, o) for n in ("dali-w2-shared", "packed", "nvalchemi") for o in config.orders} | {
        ("packed-sequential", "sequential")
    }
    quality = {o: records[("packed", o)].shuffle_quality for o in config.orders}
    assert quality["sequential"] == 0.0 and quality["shuffle"] == pytest.approx(1.0, abs=0.1)
    assert 0.0 < quality["block"] < quality["shuffle"]  # spans shuffled, then structures within buffers
    ks = {o: records[("packed", o)].batch_energy_ks for o in config.orders}
    assert all(v is not None and 0.0 < v < 1.0 for v in ks.values())
    assert records[("dali-w2-shared", "block")].samples_per_s > 0  # type: ignore[operator]
    assert records[("packed-sequential", "sequential")].shuffle_quality == 0.0
    assert records[("nvalchemi", "block")].note in ("no block order", "not installed")
    for (loader, order), record in records.items():
        if record.note is None:
            assert record.shuffle_quality == quality[order], (loader, order)  # a property of the order
            assert record.peak_pss_mb >= record.start_pss_mb > 0  # type: ignore[operator]


def test_plan_cost_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan-cost", "--n", "20000", "--max-atoms", "4096", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "budget max_atoms=4096" in out and "fixed batch_size=64" in out


def test_read_many_loaders_deliver_what_the_native_loader_does(small_store: Path) -> None:
    validate_names(["nvalchemi-dropin", "nvalchemi-dali", "nvalchemi-dali-w0", "readmany-dali-w2"])
    with pytest.raises(ValueError, match="Unknown loader 'readmany-dali-blob'"):
        validate_names(["readmany-dali-blob"])
    config = BenchConfig(
        loaders=("packed", "readmany-reads", "readmany-dali-w0", "nvalchemi-dali-w0", "nvalchemi-dropin"),
        orders=("shuffle",), rounds=1, epochs=1, batch_size=32,
    )  # fmt: skip
    by_name = {name: measure(name, "shuffle", str(small_store), config, torch.device("cpu")) for name in config.loaders}
    every_atom = by_name["packed"].unit_atoms  # one epoch of windows holds every structure once
    assert by_name["readmany-dali-w0"].unit_atoms == every_atom > 0 and by_name["readmany-dali-w0"].units == 10
    assert (by_name["readmany-reads"].unit_atoms, by_name["readmany-reads"].units) == (
        every_atom,
        by_name["packed"].units,
    )
    for name in ("nvalchemi-dali-w0", "nvalchemi-dropin"):
        assert by_name[name].note == "not installed" or (by_name[name].unit_atoms, by_name[name].units) == (
            every_atom,
            10,
        )


def test_the_nvalchemi_loaders_deliver_every_structure(small_store: Path) -> None:
    validate_names(["nvalchemi", "nvalchemi-fast", "dropin", "dropin-w0"])
    config = BenchConfig(
        loaders=("nvalchemi-fast", "dropin", "dropin-w0"), orders=("shuffle",), rounds=1, epochs=1, batch_size=32
    )
    every_atom = measure("packed", "shuffle", str(small_store), config, torch.device("cpu")).unit_atoms
    for name in config.loaders:
        got = measure(name, "shuffle", str(small_store), config, torch.device("cpu"))
        assert got.note == "not installed" or (got.unit_atoms, got.units) == (every_atom, 10), name
    budget = BenchConfig(loaders=("dropin",), orders=("shuffle",), rounds=1, epochs=1, max_atoms=500)
    assert measure("dropin", "shuffle", str(small_store), budget, torch.device("cpu")).note in (
        "no atom budget",
        "not installed",
    )


def test_max_batches_measures_the_first_batches_of_each_epoch(small_store: Path) -> None:
    config = BenchConfig(loaders=("dali-w0", "packed"), rounds=1, epochs=2, batch_size=8, max_batches=5,
                         batches_per_window=2)  # fmt: skip
    by_name = {r.loader: r for r in run_bench(str(small_store), config).records}
    assert by_name["dali-w0"].batches_per_epoch == 5  # of 38
    assert by_name["dali-w0"].samples_per_s is not None and by_name["packed"].samples_per_s is not None
    with pytest.raises(ValueError, match="max_batches must be >= 1"):
        BenchConfig(loaders=("dali",), max_batches=0)


@pytest.mark.dali
def test_block_plan_of_every_loader_is_the_loaders_own(small_store: Path) -> None:
    from dali_alchemi import DALIDataLoader

    settings = LoaderSettings(batch_size=16, cache_bytes=20_000)
    with AtomicDataZarrReader(small_store, cache_bytes=20_000) as native:
        want = DALIDataLoader(native, batch_size=16, shuffle="block", num_workers=0)
        try:
            assert bench_plan(native, "block", settings).to_dict() == want.plan.to_dict()
        finally:
            want.close()
        inner = _ReadManyOnly(native)
        adapted = ReadManyAdapter(inner)
        loader = DALIDataLoader(inner, batch_size=16, shuffle="block", num_workers=0)
        try:
            # a read_many reader is planned as the loaders plan it: fixed spans, buffers from its row bytes
            assert bench_plan(adapted, "block", settings).to_dict() == loader.plan.to_dict()
            assert bench_plan(inner, "block", settings).to_dict() == loader.plan.to_dict()
        finally:
            loader.close()


def test_read_many_dali_closes_its_reader_when_the_loader_fails(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[bool] = []
    original = _ReadManyOnly.close
    monkeypatch.setattr(_ReadManyOnly, "close", lambda self: (closed.append(True), original(self))[1])
    with pytest.raises(PlanError):
        _dali_read_many(str(small_store), "nope", LoaderSettings(), 0, False)  # type: ignore[arg-type]
    assert closed == [True]


def test_loader_names_and_options_raise_config_errors(small_store: Path) -> None:
    with pytest.raises(ConfigError, match="Unknown loader 'dali-fast'"):
        validate_names(["dali-fast"])
    with pytest.raises(ConfigError, match="Unknown loader 'dali-fast'"):
        open_loader("dali-fast", str(small_store), "shuffle", LoaderSettings())
    with pytest.raises(ConfigError, match="has no block order"):
        open_loader("pyg-dynamic", str(small_store), "block", LoaderSettings())


def test_cli_bench_explains_its_columns_and_names_the_store_in_title_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figures.append(fig), close(fig)))
    monkeypatch.setenv("COLUMNS", "200")
    png, out = tmp_path / "b.png", tmp_path / "b.json"
    assert main(["bench", "--n", "100", "--rounds", "1", "--loaders", "packed,packed-sequential,limit", "--batch-size", "16",
                 "--step-ms", "0.1", "--plot", str(png), "--json", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    store = json.loads(out.read_text())["meta"]["store"]
    assert store["structures"] == 100 and store["atoms"] > 100
    title = f"100 structures ({store['atoms']:,} atoms), batch 16, cpu, 2 epochs, 1 round"
    assert title in text
    lines = text.splitlines()
    legend = lines[next(i for i, line in enumerate(lines) if line.startswith("structures/s: after the first batch")) :]
    legend = legend[: next(i for i, line in enumerate(legend) if line.startswith("opening the store"))]
    assert all(len(line) <= 80 for line in legend) and 9 <= len(legend) <= 14
    for column in ("warm", "x plain", "first batch s", "total s", "peak PSS MB", "quality", "batch KS", "wait s",
                   "epoch / steps", "packed-sequential", "limit", "page-cache", "of limit", "decodes/chunk"):  # fmt: skip
        assert column in " ".join(legend), f"the legend explains {column!r}"
    assert "decode limit" not in text and "not a ceiling" not in text
    (fig,) = figures
    (ax,) = fig.axes
    assert ax.get_xlabel().startswith("loader") and ax.get_title().startswith(title)
    bars = [t.get_text() for t in ax.get_xticklabels()]
    assert bars == ["packed", "packed-sequential"], "the limit rows are the line, not bars"
    (line,) = [t.get_text() for t in ax.get_legend().get_texts() if t.get_text().startswith("limit")]
    assert "codecs on one core" in line and "crc32c + decode" in line
    (drawn,) = [h for h in ax.get_lines() if h.get_linestyle() == "--"]
    limit = next(r for r in json.loads(out.read_text())["records"] if r["loader"] == "limit")
    assert drawn.get_ydata()[0] == pytest.approx(limit["samples_per_s"])


def test_store_size_counts_structures_and_atoms_from_the_pointers(small_store: Path) -> None:
    from dali_alchemi.bench.runner import store_size

    with AtomicDataZarrReader(small_store) as reader:
        atoms = int(reader.sample_sizes(range(len(reader)))[0].sum())
        assert store_size(str(small_store)) == {"structures": len(reader), "atoms": atoms}


def test_decodes_per_chunk_counts_each_pass_over_the_store(small_store: Path) -> None:
    cached = BenchConfig(loaders=("packed-sequential", "dali-w0"), orders=("sequential",), rounds=1, epochs=2)
    records = {r.loader: r for r in run_bench(str(small_store), cached).records}
    # the whole store fits the 64 MiB cache: every chunk is decoded in the first pass, none in the second
    assert records["packed-sequential"].decodes_per_chunk == pytest.approx(0.5)
    assert records["dali-w0"].decodes_per_chunk is None  # its reads happen inside the loader
    uncached = BenchConfig(loaders=("packed",), orders=("sequential",), rounds=1, epochs=2, cache_bytes=0)
    (record,) = run_bench(str(small_store), uncached).records
    assert record.decodes_per_chunk is not None and record.decodes_per_chunk >= 1.0, "no cache: every pass decodes"
