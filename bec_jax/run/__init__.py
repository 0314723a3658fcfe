"""Runs: the table of kinds, run directories, the runner, studies, the watchdog and figure workers."""
