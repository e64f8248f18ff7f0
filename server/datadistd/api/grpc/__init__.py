"""The only gRPC code of the daemon: servicers, proto <-> domain conversion, one error mapping."""
