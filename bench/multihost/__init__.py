"""Parts of bench/multihost_throughput.py: what is sampled (sampler), one run and its figures
(runs), the schedule (plan), the links' raw TCP reference (reference, tcp_blast) and the report."""
