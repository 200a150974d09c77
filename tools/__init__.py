"""Tools for developing pgqueue that are not part of the package (the documentation's build)."""
