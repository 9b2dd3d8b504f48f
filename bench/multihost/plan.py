"""Which configurations multihost_throughput runs, and in which order (interleaved, rotated).

A round runs every configuration once. Configurations are grouped by link setting (the links
are shaped once per group; "loopback" is the group of shoal-local runs), and the groups and the
configurations inside each group start one place further on every round, so that every system
runs early and late, next to the ones it is compared with.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.multihost.runs import COLOCATED, Config, System

SHAPED = ("1gbit", "10gbit")
LINKS = (*SHAPED, "unshaped")


def parse_shape(text: str) -> tuple[int, int, bool]:
    """'2ps+2w' -> (2, 2, False); '2ps+2w/colocated' -> (2, 2, True): one ps and one worker per host."""
    colocated = text.endswith(COLOCATED)
    ps, _, workers = text.removesuffix(COLOCATED).partition("+")
    if not (ps.endswith("ps") and workers.endswith("w") and ps[:-2].isdigit() and workers[:-1].isdigit()):
        raise ValueError(f"shape {text!r} is not like 1ps+2w or 2ps+2w{COLOCATED}")
    if colocated and int(ps[:-2]) != int(workers[:-1]):
        raise ValueError(f"shape {text!r}: a colocated shape has as many ps as workers, e.g. 2ps+2w{COLOCATED}")
    return int(ps[:-2]), int(workers[:-1]), colocated


def matrix(models: Sequence[str], modes: Sequence[str], shapes: Sequence[str], links: Sequence[str],
           plain_links: Sequence[str], ddp_workers: Sequence[int], loopback: bool = True,
           whole_push_links: Sequence[str] = ()) -> list[Config]:
    """Every configuration of one round, grouped by link (loopback last), comparisons adjacent."""
    configs = []
    for link in links:
        for model in models:
            for shape in shapes:
                ps, workers, colocated = parse_shape(shape)
                for mode in modes:
                    configs.append(Config(System.SHOAL_SSH, model, mode, ps, workers, link, "curve",
                                          colocated=colocated))
                    if link in plain_links:
                        configs.append(Config(System.SHOAL_SSH, model, mode, ps, workers, link, "plain",
                                              colocated=colocated))
                    if link in whole_push_links:
                        configs.append(Config(System.SHOAL_SSH, model, mode, ps, workers, link, "curve", "whole",
                                              colocated=colocated))
            for n in ddp_workers:
                configs.append(Config(System.DDP, model, "sync", 0, n, link, "-"))
    if loopback:
        for model in models:  # on loopback every task shares one host: a colocated shape is its plain one
            for ps, workers in dict.fromkeys(parse_shape(shape)[:2] for shape in shapes):
                for mode in modes:
                    configs.append(Config(System.SHOAL_LOCAL, model, mode, ps, workers, "loopback", "plain"))
    return configs


def rounds(configs: Sequence[Config], count: int) -> list[list[Config]]:
    """`count` orders of `configs`: link groups rotated by the round, and each group's
    configurations rotated by the round too."""
    groups: dict[str, list[Config]] = {}
    for config in configs:
        groups.setdefault(config.link, []).append(config)
    names = list(groups)
    out = []
    for r in range(count):
        order = []
        for name in names[r % len(names):] + names[:r % len(names)]:
            group = groups[name]
            k = r % len(group)
            order += group[k:] + group[:k]
        out.append(order)
    return out
