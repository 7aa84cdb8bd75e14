"""Reusable builders of test data."""
