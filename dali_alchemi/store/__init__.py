"""The nvalchemi 0.2.0 Zarr store: layout rules, writer, reader and the chunk machinery under them."""
