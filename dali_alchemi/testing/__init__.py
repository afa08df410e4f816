"""Test helpers that ship with the package, for implementations of this project's seams.

:class:`~dali_alchemi.testing.reader.PackedReaderTests` is the contract of
:class:`~dali_alchemi.store.format.protocol.PackedReader`: subclass it in a pytest module, give it a reader
and the samples it should hold, and every loader of this project can read through that reader.
Importing it needs pytest; nothing else in the package imports this module.
"""
