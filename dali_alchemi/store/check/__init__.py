"""Checking stores without changing them: the whole-store verification with its consistency checks
(pointers, masks, neighbor lists), and the inference of how appended neighbor lists were stored (the
plan a repair applies). Imports only the format and read sub-packages."""
