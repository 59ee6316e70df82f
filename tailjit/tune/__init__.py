"""Schedule tuning: kernels' fingerprints, the database of measured schedules every build consults, and the
worker that measures candidates (``docs/tuning.md``)."""
