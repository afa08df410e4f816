"""Reading stores: the open-time checks, consistent snapshots, the chunk-block engine (routes, decoder,
pool, fetch, codecs, cache, gather, rows read in place, blocks shared between processes), the public
reader (its read-time guards, field selection, chunk geometry, and the opening of one for a loader),
several stores behind one index, the slow-layout advice and the summary. Imports only
:mod:`dali_alchemi.store.format`."""
