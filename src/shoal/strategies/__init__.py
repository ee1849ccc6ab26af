"""How the work is distributed: one strategy object per `[strategy] type`."""
