"""Build C with the system compiler, cache it on disk, load and call it."""
