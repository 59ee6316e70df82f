"""Tuning records: kernels' fingerprints and the database of measured schedules that every build consults
(``docs/tuning.md``).  What measures candidates is ``tailjit.tuner``, above the API."""
