"""What a store is on disk and how it is addressed: names, levels and rules (layout), the packed
currency and the reader protocol, locations (paths, URLs, zarr Stores), the write journal and the
generation token. Imports nothing else of the store."""
