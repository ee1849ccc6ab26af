"""Red-team tests: corrupt, truncate, race and lie to shoal; nothing may be lost, every error clear."""
