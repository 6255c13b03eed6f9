"""rayfed's version, one value: the package's ``__version__`` and what a run marker records of the code that ran."""

__all__ = ["VERSION"]

VERSION = "0.1.0"
