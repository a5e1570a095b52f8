"""Coming back from a checkpoint: one execution of a job and its restarts
(``restart``), reading a checkpoint for a restore (``restore``), taking back
sink output committed after it (``supersede``) and putting the records it
holds in flight back into their channels (``reinjection``)."""
