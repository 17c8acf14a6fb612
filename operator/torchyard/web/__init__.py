"""The web view of runs, sweeps, models, Environments and the queue (``torchyard ui``):
an aiohttp application (``app``) whose routes (``views``) read through one seam
(``source.RunSource``) and render pages (``pages``, ``html``) with a little JavaScript
and the assets in ``static/``. See docs/how-to/web-view.md.
"""
