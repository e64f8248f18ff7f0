"""An engine: its cache registry and memory (``engine.py``), and the views of its rows that threads other than
the event loop read by: where a small pull lands (``pullview.py``) and what a peer's small read or write is served
by (``readview.py``)."""
