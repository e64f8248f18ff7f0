"""What the operator sets and reads: the daemon's configuration (``config.py``), the peer secret
(``peersecret.py``), the metrics (``metrics.py``) and the snapshot of the node they and ``datadistctl`` read
(``snapshot.py``)."""
