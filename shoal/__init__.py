"""Shoal: parameter-server distributed training for Python.

The public names live here; see README.md for a tour. Importing `shoal` does not import
PyTorch (use `shoal.train.torch_model` for that), so parameter servers stay small.
"""

__version__ = "0.1.0"
