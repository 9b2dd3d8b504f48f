"""The launcher: job spec -> allocation (per executor) + pure render into a plan
(printable) -> executor (local) under a supervisor (teardown and restart policy), log
multiplexer, and job records.

Talks to tasks only through argv, the environment and TF_CONFIG; imports `shoal.cluster`
and `shoal.errors` and nothing else of Shoal. Import the submodules directly
(`shoal.launch.spec`, `shoal.launch.plan`, ...); this package file stays empty so the
watchdog (`reaper.py`) and light commands start fast.
"""
