"""The DALI side: the external-source callable, the pipeline, the iterator and the loader that ties them.

This is the only package that imports DALI.
"""
