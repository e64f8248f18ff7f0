"""What two daemons say on a link: handshake records, owner-call records and their frames. Imports only ``core``."""
