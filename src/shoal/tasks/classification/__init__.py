"""Classification: an MLP or any user module trained with cross-entropy."""
