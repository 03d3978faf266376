"""EAGLE-3 speculative drafts: the reference speculative decoder, the draft head, its training
against the target as served, the speculators format, and acceptance measurement."""
