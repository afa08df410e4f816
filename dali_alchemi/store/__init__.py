"""The nvalchemi 0.2.0 Zarr store: layout rules, writer, reader and the chunk machinery under them."""

import warnings

# The "inflate" layout stores numcodecs' shuffle and lz4 (zarr's ``numcodecs.*`` codecs), knowingly outside
# the zarr v3 spec; zarr warns each time it opens such an array. Only that warning is silenced.
warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3 specification")
