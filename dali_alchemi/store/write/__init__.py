"""Changing stores: the writer and its operations, the writer lock, crash recovery, defragment, the
repair that applies a repair plan, and rewrite to another layout. The top of the store: it may import
every other sub-package, and none imports it."""
