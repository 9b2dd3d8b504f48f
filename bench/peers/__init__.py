"""Shoal side by side with TensorFlow and PyTorch on the same machine, in one run (issue 5).

    python -m bench.peers [--quick] [--json]

Modules, one job each: `systems` (what to launch, as data), `runner` (a JobSpec's run through
bench/jobrun.py), `metrics` (figures of one run), `ladder` (Shoal's steps to 0.90), `report`
(medians, ratios, goals, tables), `venv` (the peers' virtualenv), `plot` (the PNG, run in that
venv). The peer programs (`tf1_graph`, `tf2_ps`, `tf_mwms`, `torch_ddp`, sharing `peerlib`) run
in the peers' virtualenv and import neither shoal nor bench. Not run by CI; see bench/README.md.
"""
