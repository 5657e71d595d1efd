"""The package's version, on its own so that any module can name it without importing the API."""

__version__ = "0.1.0"
