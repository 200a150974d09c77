"""The package's version, in a module of its own so that code inside the package (tracing
names its instrumentation with it) can read it without importing the package's facade."""

__version__ = "0.1.0"
