"""Data and model inputs: what a URI names, how it is fetched, and the cache it lands in.

Standard library only (the fetch Job runs it with no other package, and local mode uses
it too): ``uris`` (parsing, the cache key), ``patterns`` (include and exclude),
``archives`` (safe unpacking), ``transfer`` (resumed HTTP downloads), one module per
fetched scheme (``web``, ``models``), ``cache`` (entries on disk, the LRU rule) and
``fetch`` (the one interface, and the fetch Job's entry point).
"""
