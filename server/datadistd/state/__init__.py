"""What the daemon holds and knows, below the links: engines and their read views, config, status records, metrics,
the peer secret."""
