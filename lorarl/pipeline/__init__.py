"""Running studies: the submitit launcher, in-flight jobs, status/watch, doctor, provenance, fault drills."""
