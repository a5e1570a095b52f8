"""Coming back from a checkpoint: reading it for a restore and taking back
sink output committed after it."""
