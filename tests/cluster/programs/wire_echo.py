"""A bare RpcServer that answers each request with the request's own tensors: the peer that
transport tests attack and talk to.

    python tests/cluster/programs/wire_echo.py ADDRESS [--security auto|plain|curve]
                                               [--nofile SOFT HARD] [--no-shared-memory]

The job secret comes from SHOAL_JOB_SECRET. `--nofile` sets this process's open-file limit
before the server starts (as a shell's `ulimit -n` would); `--no-shared-memory` refuses every
client's shared-memory area. Prints `serving` once bound and
`handled <op>` for every request the handler receives (`handled <op> on the doorbell` for one
that came on a doorbell line, shoal/wire/doorbell.py), so a test can tell whether anything got
through and how. A request of op `refuse` gets an error reply; one of op `grow` gets each tensor
back twice over (a reply bigger than the request); one of op `hold` gets no reply at all; one of
op `slow` is answered after 0.3 s. Runs until killed.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys

from shoal.wire import JobSecret, Request, RpcServer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--security", default=None, choices=["auto", "plain", "curve"])
    parser.add_argument("--nofile", nargs=2, type=int, metavar=("SOFT", "HARD"))
    parser.add_argument("--no-shared-memory", dest="shared_memory", action="store_false")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    if args.nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, tuple(args.nofile))
    server: RpcServer

    def handle(request: Request) -> None:
        print(f"handled {request.op}{'' if type(request.peer) is bytes else ' on the doorbell'}", flush=True)
        if request.op == "hold":
            return
        if request.op == "slow":
            import time
            time.sleep(0.3)
        if request.op == "refuse":
            server.reply_error(request, "refused as asked")
            return
        if request.op == "grow":
            import numpy as np
            server.reply(request, {"echo": request.op}, {n: np.concatenate([t, t]) for n, t in request.tensors.items()})
            return
        server.reply(request, {"echo": request.op}, dict(request.tensors))

    kwargs = {"shared_memory": args.shared_memory}
    if args.security is not None:
        from shoal.wire import Security
        kwargs["security"] = Security(args.security)
    secret = JobSecret(os.environ["SHOAL_JOB_SECRET"].encode(), "SHOAL_JOB_SECRET")  # this program's edge
    server = RpcServer(args.address, secret, handle, "echo", **kwargs)
    server.start()
    print("serving", flush=True)
    while True:
        server.serve_once(100)


if __name__ == "__main__":
    sys.exit(main())
