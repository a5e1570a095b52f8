"""Moving records between tasks: events, bounded channels, output writers,
buffer debloating, feedback channels and loop termination."""
