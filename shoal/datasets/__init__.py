"""Small datasets that ship inside installed packages (no downloads at run time)."""
