"""Back-edges of cyclic jobs (docs/concepts/cycles.md): the feedback channel that always
accepts (spilling to disk past a memory bound) and the back-edge log that
holds the records in flight round a loop at a checkpoint."""

from eddyflow.backedge.feedback import FeedbackChannel
from eddyflow.backedge.log import read_backedge_log, write_backedge_log

__all__ = ["FeedbackChannel", "read_backedge_log", "write_backedge_log"]
