"""Example applications using pgqueue (not part of the package; tested in tests/examples)."""
