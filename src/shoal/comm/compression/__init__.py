"""Gradient compression: what each rank sends instead of its dense bucket."""
