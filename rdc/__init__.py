"""rdc: file-sync differential compression."""

# Also in pyproject.toml (a test checks they agree); read here, not from the installed
# metadata, which costs a command's start-up some 7 ms.
__version__ = "0.1.0"
