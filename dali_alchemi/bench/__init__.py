"""Benchmark support: the synthetic dataset recipe and the timing runner (see ``dali-alchemi bench``)."""
