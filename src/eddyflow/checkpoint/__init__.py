"""The checkpoint storage: the folder's layout, typed metadata, commits, the
shared-file registry, the folder lock, durable writes and the writer process."""
