"""Fault drills: kill a study's jobs at random, recover it, check it against a reference."""
