"""autosp's PyTorch side: exporting a model for `autosp import` (see export.py)."""
