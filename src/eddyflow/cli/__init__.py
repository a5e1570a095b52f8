"""The ``eddyflow`` command line (click)."""
