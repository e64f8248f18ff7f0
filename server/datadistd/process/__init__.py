"""The daemon as a process: the ``datadistd`` and ``datadistctl`` commands, the app that wires the rooms, systemd."""
