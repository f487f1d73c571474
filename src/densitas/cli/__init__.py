"""The ``densitas`` command line."""
