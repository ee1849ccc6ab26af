"""Gradient communication: buckets filled during backward, and the aggregators that reduce them."""
