"""Who may do what, and how much: admission of strangers, link authorization, quotas, the fair executor, and the
daemon's socket files."""
