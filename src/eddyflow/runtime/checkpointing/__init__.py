"""The checkpoint protocol: the coordinator, the barrier handler, a task's
snapshot (the participant), channel state and back-edge logging."""
