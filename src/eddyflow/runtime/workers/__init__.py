"""A job over worker processes (docs/concepts/workers.md): which worker runs
which task (``placement``), forking, watching and stopping the workers
(``process``), what the caller and a worker say to each other
(``protocol``), the caller's side of an attempt (``caller``) and a worker's
(``worker``). Channels between workers are in ``runtime/exchange/remote.py``."""
