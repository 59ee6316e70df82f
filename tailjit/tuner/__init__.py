"""The tuner: what makes tuning records (the measuring worker).  The records themselves, and what every build
reads from them, are ``tailjit.tunedb``, below the API; this package builds programs, so it sits above it
(``docs/tuning.md``)."""
