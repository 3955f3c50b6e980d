"""Not a library package: lets mypy and pytest import these files by module path."""
