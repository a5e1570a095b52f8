"""The operators a task chains, one module per kind (see ``base.py``)."""
