"""Every way into the daemon: the gRPC services (``api/grpc/``) and the attach socket (``api/attach.py``)."""
