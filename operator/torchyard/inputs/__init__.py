"""Data and model inputs: what a URI names, how it is fetched, and the cache it lands in.

Standard library only (the fetch Job and local mode run it), but for ``hf``, which reads
the Hugging Face Hub through ``huggingface_hub``: ``uris`` (parsing, the cache key),
``patterns`` (include and exclude), ``archives`` (safe unpacking), ``transfer`` (resumed
HTTP downloads), one module per fetched scheme (``web``, ``models``, ``s3``, ``hf``),
``cache`` (entries on disk, the LRU rule) and ``fetch`` (the one interface, and the fetch
Job's entry point).
"""
