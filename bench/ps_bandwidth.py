"""Push+pull round trip through Shoal against a raw TCP socket, 4 KiB to 128 MiB.

    python -m bench.ps_bandwidth            # table
    python -m bench.ps_bandwidth --json     # table, then one JSON object as the last line

Four processes: this one (the clients), a real Shoal ps (`shoal.Server`), a TCP echo server
and a bare zmq ROUTER echo. Per tensor size, the sides run interleaved (A B C D, then
B C D A, ...) and each figure is the median of the samples:

    shoal_s    TrainingSession.push of one float32 variable of that size: the gradient goes
               to the ps, the ps applies SGD (learning rate 0) and sends the new value back in
               the same round trip, the session copies it into `session.params`. The variable
               is cut into shards of the session's part size and the push travels in that many
               messages, pipelined: by default (the ps is on loopback) 4 MiB, so a 128 MiB push
               is 32 requests; `--part_bytes 262144` gives the part size used between hosts
               (512 requests at 128 MiB)
    rpc_s      the same 'push' (pull=True) of the whole variable in one message (4 MiB chunks)
               through a bare RpcClient: no copy into params
    zmq_s      a bare zmq DEALER/ROUTER echo of the same bytes in Shoal's chunks (no auth, no
               header, no update): the ceiling of the transport Shoal is built on
    raw_s      a raw TCP socket (TCP_NODELAY): send N bytes, the peer recv_into's them into a
               preallocated buffer and sends them back, we recv_into a preallocated buffer
    update_s   `param -= 0.0 * grad` at that size, in this process: the ps's update rule,
               which the raw side does not do, so the reader sees how much of the gap it is

ratio_vs_raw = raw_s / shoal_s (a throughput ratio: > 1 means Shoal is faster), taken as the
median over rounds of the ratio within each round; the *_s figures are plain medians.
cpu_vs_raw = CPU seconds per Shoal push (this process and the ps, all threads) / CPU seconds
per raw round trip (this process and the TCP echo): what the push costs the machine, which
other processes' load moves much less than wall time (medians of each; `cpu_s` has them all).

Tiny messages: a bare zmq DEALER/ROUTER round trip of 8 bytes (no auth, no msgpack) against
a Shoal 'status' request (header only) and a 4-byte push through TrainingSession; wall time
(the goal) and CPU time of both processes per round trip (all threads, zmq's I/O thread
included), which shifts much less with the load other processes put on the machine.

Goals (issue 2): >= 0.9x raw at 1-16 MiB, >= 0.8x at 128 MiB, tiny <= 1.3x bare zmq.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import socket
import struct
import sys
import time
from typing import Callable

import numpy as np

import shoal
from bench import free_ports, machine, median
from shoal.train.part_size import PartSize
from bench.jobrun import Job, JobState, Launch, clean_env
from shoal.ps.protocol import ASYNC, InitRequest
from shoal.wire import CHUNK_BYTES, RpcClient

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB]
GOALS = {1 * MiB: 0.9, 4 * MiB: 0.9, 16 * MiB: 0.9, 128 * MiB: 0.8}
TINY_GOAL = 1.3
TINY_ITERS, TINY_SAMPLES = 20, 101
_HEADER = struct.Struct("<Q")


def plan(nbytes: int) -> tuple[int, int]:
    """(round trips per sample, samples) for a size: short samples and many rounds for small
    tensors, fewer rounds for big ones, so the whole run stays near a minute."""
    iters = max(1, min(16, MiB // nbytes))
    samples = 41 if nbytes <= 1 * MiB else 21 if nbytes <= 4 * MiB else 11 if nbytes <= 16 * MiB else 7
    return iters, samples


# -- reference servers (child processes) --------------------------------------------------

def serve_tcp(port: int) -> None:
    """Echo server: for each request (8-byte length + payload) recv_into a preallocated buffer,
    then send the same bytes back. One connection at a time. Blocks forever."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1)
    buf = bytearray(1 * MiB)
    head = memoryview(bytearray(_HEADER.size))
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while _recv_exact(conn, head):
                (n,) = _HEADER.unpack(head)
                if n > len(buf):
                    buf = bytearray(n)
                view = memoryview(buf)[:n]
                if not _recv_exact(conn, view):
                    break
                conn.sendall(view)


def serve_zmq(port: int) -> None:
    """Bare ROUTER echo: no auth, no header parsing. Blocks forever."""
    import zmq
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    while True:
        sock.send_multipart(sock.recv_multipart(copy=False), copy=False)


def _recv_exact(conn: socket.socket, view: memoryview) -> bool:
    """Fill `view` from `conn`. False if the peer closed first."""
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


# -- clients -----------------------------------------------------------------------------

class RawClient:
    """TCP client for `serve_tcp`. Not thread-safe."""

    def __init__(self, port: int):
        self.port = port
        self.sock: socket.socket | None = None

    def connect(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def roundtrip(self, payload: memoryview, rx: memoryview) -> None:
        self.sock.sendall(_HEADER.pack(len(payload)))
        self.sock.sendall(payload)
        if not _recv_exact(self.sock, rx[:len(payload)]):
            raise ConnectionError("the TCP echo server closed the connection")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class BareZmqClient:
    """DEALER client for `serve_zmq`. Not thread-safe."""

    def __init__(self, port: int):
        import zmq
        self._zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 30_000)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def roundtrip(self, payload: bytes) -> None:
        self.sock.send(payload)
        self.sock.recv()

    def roundtrip_frames(self, frames: list) -> None:
        """Send `frames` zero-copy, as Shoal sends a tensor's chunks, and receive them back."""
        self.sock.send_multipart(frames, copy=False)
        self.sock.recv_multipart(copy=False)

    def close(self) -> None:
        self.sock.close(linger=0)


class ShoalSide:
    """A real ps process plus, in this process, one TrainingSession per variable and one
    RpcClient. Variable `v<bytes>` is a float32 vector of that many bytes; `tiny` is 4 bytes.

    Every session is a distinct worker task, so when all of them have closed (said 'done')
    the ps ends the job and exits 0 by itself, as in training.
    """

    def __init__(self, sizes: list[int], push_part_bytes: int | None | PartSize = PartSize.AUTO,
                 shared_memory: bool = True):
        self.push_part_bytes = push_part_bytes
        self.shared_memory = shared_memory
        self.values = {"tiny": np.zeros(1, np.float32), **{f"v{n}": np.zeros(n // 4, np.float32) for n in sizes}}
        ports = free_ports(1 + len(self.values))
        self.spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
        self.secret_text = secrets.token_hex(16)
        self.secret = shoal.JobSecret(self.secret_text.encode(), "bench")
        self.job = Job()
        self.ps_pid: int | None = None
        self.ps_exit: int | None = None
        self.client: RpcClient | None = None
        self.sessions: dict[str, shoal.TrainingSession] = {}

    def start(self) -> None:
        """Start the ps, create and initialize every variable on it, open the sessions. Blocks."""
        tf_config = json.dumps({"cluster": self.spec, "task": {"type": "ps", "index": 0}})
        env = clean_env(os.environ, {"TF_CONFIG": tf_config, "SHOAL_JOB_SECRET": self.secret_text})
        self.ps_pid = self.job.start(Launch("ps:0", (
            "-c", "import os, shoal; shoal.Server.for_task(shoal.resolve_cluster_config(None, os.environ), "
                  "secret=shoal.resolve_job_secret(os.environ)).join()"), env)).pid
        self.client = RpcClient(self.spec["ps"][0], self.secret, "ps:0", timeout_s=120,
                                shared_memory=self.shared_memory)
        self.client.call("status", timeout_s=30)  # waits for the ps to come up
        spec = shoal.ClusterSpec.from_dict(self.spec)
        for i, (name, value) in enumerate(self.values.items()):
            config = shoal.ClusterConfig(spec, shoal.TaskId("worker", i))
            self.sessions[name] = shoal.TrainingSession(config, {name: value}, shoal.SGD(0.0), secret=self.secret,
                                                        request_timeout_s=120, push_part_bytes=self.push_part_bytes,
                                                        shared_memory=self.shared_memory)
        rule = shoal.SGD(0.0).to_config()
        for name, value in self.values.items():
            # the session's shards (a large variable travels in parts of the session's part size),
            # and the whole variable under "rpc/<name>" for the bare RpcClient's one-message push
            shards = {s.name: s.rows(value) for s in self.sessions[name].placement.shards}
            self.client.call("init", InitRequest(rule, ASYNC).fields(), {**shards, f"rpc/{name}": value})
        self.client.call("ready")
        for session in self.sessions.values():
            session.start()

    def push(self, name: str, grad: np.ndarray) -> None:
        self.sessions[name].push({name: grad})

    def rpc_push(self, name: str, grad: np.ndarray) -> None:
        self.client.call("push", {"task": "worker:0", "step": 0, "pull": True}, {f"rpc/{name}": grad})

    def status(self) -> None:
        self.client.call("status")

    def close(self) -> int | None:
        """Close the sessions (the ps then exits by itself) and make sure the ps is gone.
        Returns the ps exit code (None if it had to be killed). Idempotent."""
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.job.state is not JobState.CLOSED:
            self.ps_exit = self.job.wait(time.monotonic() + 10).get("ps:0")
            self.job.close()
        return self.ps_exit


# -- measurement -------------------------------------------------------------------------

def sample(fn: Callable[[], None], iters: int) -> float:
    """Seconds per call of `fn`, over `iters` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def interleaved(variants: dict[str, Callable[[], None]], iters: int, samples: int, warmup: int = 2,
                cpu: dict[str, Callable[[], float]] | None = None,
                cpu_out: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round, sampling them in rotating
    order (A B C, B C A, ...) so that slow phases of a shared machine hit every side.
    With `cpu` (variant -> cumulative CPU seconds of the processes it involves), also puts
    the CPU seconds per call of each sample in `cpu_out`."""
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(samples):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = cpu[name]() if cpu else 0.0
            times[name].append(sample(variants[name], iters))
            if cpu and cpu_out is not None:
                cpu_out.setdefault(name, []).append((cpu[name]() - before) / iters)
    return times


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time used so far by this process (pid None) or by process `pid`, all threads,
    with nanosecond resolution (Linux schedstat; falls back to psutil's clock ticks)."""
    if pid is None:
        return time.process_time()
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError):
        import psutil
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system


def page_faults(fn: Callable[[], None], pid: int, calls: int = 3) -> dict[str, float]:
    """Minor page faults per call of `fn`, in this process and in process `pid` (Linux).
    Each fault is a fresh page the kernel zeroes: the sign of buffers freed and reallocated."""
    def ours() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def theirs() -> int:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt
        except (OSError, ValueError, IndexError):
            return -calls  # not Linux: report -1
    a, b = ours(), theirs()
    for _ in range(calls):
        fn()
    return {"client": round((ours() - a) / calls), "ps": round((theirs() - b) / calls)}


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num/den: samples of one round ran seconds apart at most, so
    their ratio cancels most of the load other processes put on the machine."""
    return median([a / b for a, b in zip(num, den)])


def run(sizes: list[int], log: Callable[[str], None], push_part_bytes: int | None | PartSize = PartSize.AUTO,
        shared_memory: bool = True) -> dict:
    echoes = Job()
    shoal_side = raw = bare = None
    tcp_port, zmq_port = free_ports(2)
    try:
        for kind, port in (("tcp", tcp_port), ("zmq", zmq_port)):
            echoes.start(Launch(f"{kind}-echo", ("-m", "bench.ps_bandwidth", "--serve", kind, str(port)),
                                clean_env(os.environ)))
        shoal_side = ShoalSide(sizes, push_part_bytes, shared_memory)
        shoal_side.start()
        raw = RawClient(tcp_port)
        raw.connect()
        bare = BareZmqClient(zmq_port)
        rx = memoryview(bytearray(max(sizes)))

        tiny_grad = np.ones(1, np.float32)
        zmq_pid, ps_pid = echoes.task("zmq-echo").pid, shoal_side.ps_pid
        tcp_pid = echoes.task("tcp-echo").pid
        tiny_cpu: dict[str, list[float]] = {}
        tiny = interleaved({"bare_zmq": lambda: bare.roundtrip(b"01234567"),
                            "shoal_status": shoal_side.status,
                            "shoal_push_4B": lambda: shoal_side.push("tiny", tiny_grad)},
                           iters=TINY_ITERS, samples=TINY_SAMPLES, warmup=50,
                           cpu={"bare_zmq": lambda: cpu_seconds() + cpu_seconds(zmq_pid),
                                "shoal_status": lambda: cpu_seconds() + cpu_seconds(ps_pid),
                                "shoal_push_4B": lambda: cpu_seconds() + cpu_seconds(ps_pid)},
                           cpu_out=tiny_cpu)
        tiny_ratio = paired_ratio(tiny["shoal_status"], tiny["bare_zmq"])
        tiny_push_ratio = paired_ratio(tiny["shoal_push_4B"], tiny["bare_zmq"])
        tiny_s = {k: median(v) for k, v in tiny.items()}
        tiny_cpu_s = {k: median(v) for k, v in tiny_cpu.items()}
        log(f"tiny: bare zmq {tiny_s['bare_zmq'] * 1e6:.0f} us, shoal status {tiny_s['shoal_status'] * 1e6:.0f} us "
            f"({tiny_ratio:.2f}x), shoal 4-byte push {tiny_s['shoal_push_4B'] * 1e6:.0f} us ({tiny_push_ratio:.2f}x)")
        log(f"tiny, CPU per round trip (both processes): bare zmq {tiny_cpu_s['bare_zmq'] * 1e6:.0f} us, shoal status "
            f"{tiny_cpu_s['shoal_status'] * 1e6:.0f} us ({tiny_cpu_s['shoal_status'] / tiny_cpu_s['bare_zmq']:.2f}x), "
            f"shoal 4-byte push {tiny_cpu_s['shoal_push_4B'] * 1e6:.0f} us "
            f"({tiny_cpu_s['shoal_push_4B'] / tiny_cpu_s['bare_zmq']:.2f}x)")

        results = []
        for n in sizes:
            name = f"v{n}"
            grad = np.ones(n // 4, np.float32)
            param = np.zeros(n // 4, np.float32)
            payload = memoryview(grad).cast("B")
            chunks = [payload[i:i + CHUNK_BYTES] for i in range(0, n, CHUNK_BYTES)]

            def update(param=param, grad=grad):
                param -= 0.0 * grad  # exactly what shoal.SGD.apply runs on the ps

            iters, samples = plan(n)
            cpu: dict[str, list[float]] = {}
            times = interleaved({"shoal": lambda: shoal_side.push(name, grad),
                                 "rpc": lambda: shoal_side.rpc_push(name, grad),
                                 "zmq": lambda: bare.roundtrip_frames(chunks),
                                 "raw": lambda: raw.roundtrip(payload, rx),
                                 "update": update}, iters, samples,
                                cpu={"shoal": lambda: cpu_seconds() + cpu_seconds(ps_pid),
                                     "rpc": lambda: cpu_seconds() + cpu_seconds(ps_pid),
                                     "zmq": lambda: cpu_seconds() + cpu_seconds(zmq_pid),
                                     "raw": lambda: cpu_seconds() + cpu_seconds(tcp_pid),
                                     "update": cpu_seconds}, cpu_out=cpu)
            t = {k: median(v) for k, v in times.items()}
            cpu_s = {k: median(v) for k, v in cpu.items()}
            goal = GOALS.get(n)
            ratio = paired_ratio(times["raw"], times["shoal"])
            faults = page_faults(lambda: shoal_side.push(name, grad), shoal_side.ps_pid)
            rpc_faults = page_faults(lambda: shoal_side.rpc_push(name, grad), shoal_side.ps_pid)
            row = {"bytes": n, "shoal_s": t["shoal"], "rpc_s": t["rpc"], "zmq_s": t["zmq"], "raw_s": t["raw"],
                   "update_s": t["update"], "ratio_vs_raw": round(ratio, 3),
                   "rpc_ratio_vs_raw": round(paired_ratio(times["raw"], times["rpc"]), 3),
                   "zmq_ratio_vs_raw": round(paired_ratio(times["raw"], times["zmq"]), 3),
                   "page_faults_per_push": faults, "rpc_page_faults_per_push": rpc_faults, "pages": n // 4096,
                   "update_share_of_raw": round(t["update"] / t["raw"], 3),
                   "cpu_s": cpu_s, "cpu_vs_raw": round(cpu_s["shoal"] / cpu_s["raw"], 3),
                   "rpc_cpu_vs_raw": round(cpu_s["rpc"] / cpu_s["raw"], 3),
                   "shoal_gbps": round(2 * n / t["shoal"] / 1e9, 3), "raw_gbps": round(2 * n / t["raw"] / 1e9, 3),
                   "iters_per_sample": iters, "samples": samples,
                   "goal": goal, "met": None if goal is None else ratio >= goal}
            results.append(row)
            log(_row(row))
            del grad, param, payload, chunks
        ps_exit = shoal_side.close()
        return {"results": results,
                "tiny_vs_bare_zmq": round(tiny_ratio, 3),
                "tiny_push_vs_bare_zmq": round(tiny_push_ratio, 3),
                "tiny_s": tiny_s, "tiny_goal": TINY_GOAL, "tiny_met": tiny_ratio <= TINY_GOAL,
                "tiny_cpu_s": tiny_cpu_s,
                "tiny_cpu_vs_bare_zmq": round(tiny_cpu_s["shoal_status"] / tiny_cpu_s["bare_zmq"], 3),
                "tiny_push_cpu_vs_bare_zmq": round(tiny_cpu_s["shoal_push_4B"] / tiny_cpu_s["bare_zmq"], 3),
                "goals_met": all(r["met"] for r in results if r["met"] is not None) and tiny_ratio <= TINY_GOAL,
                "push_part_bytes": part_bytes_name(push_part_bytes), "shared_memory": shared_memory, "ps_exit_code": ps_exit, "machine": machine()}
    finally:
        if raw is not None:
            raw.close()
        if bare is not None:
            bare.close()
        if shoal_side is not None:
            shoal_side.close()
        echoes.close()


def part_bytes_name(part_bytes: int | None | PartSize) -> int | str | None:
    """How the report names the sessions' part size: "auto", bytes, or None (one message)."""
    return part_bytes.value if isinstance(part_bytes, PartSize) else part_bytes


def _part_bytes(text: str) -> int | None | PartSize:
    if text == "auto":
        return PartSize.AUTO
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'auto' or a number of bytes >= 0 (0: one message)")
    return value or None


def _human(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


_COLUMNS = f"{'size':>8} {'shoal_ms':>9} {'rpc_ms':>8} {'zmq_ms':>8} {'raw_ms':>8} {'update_ms':>9} " \
           f"{'shoal/raw':>9} {'rpc/raw':>8} {'zmq/raw':>8} {'cpu/raw':>8} {'faults c/ps':>12} {'rpc faults':>11}  goal"


def _row(r: dict) -> str:
    goal = "" if r["goal"] is None else f">={r['goal']} {'met' if r['met'] else 'MISSED'}"
    faults = f"{r['page_faults_per_push']['client']}/{r['page_faults_per_push']['ps']}"
    rpc_faults = f"{r['rpc_page_faults_per_push']['client']}/{r['rpc_page_faults_per_push']['ps']}"
    return (f"{_human(r['bytes']):>8} {r['shoal_s'] * 1e3:9.3f} {r['rpc_s'] * 1e3:8.3f} {r['zmq_s'] * 1e3:8.3f} "
            f"{r['raw_s'] * 1e3:8.3f} {r['update_s'] * 1e3:9.3f} {r['ratio_vs_raw']:9.2f} {r['rpc_ratio_vs_raw']:8.2f} "
            f"{r['zmq_ratio_vs_raw']:8.2f} {r['cpu_vs_raw']:8.2f} {faults:>12} {rpc_faults:>11}  {goal}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one line holding a JSON object")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                        help="comma-separated tensor sizes in bytes (multiples of 4)")
    parser.add_argument("--part_bytes", type=_part_bytes, default=PartSize.AUTO,
                        help="the sessions' push_part_bytes: auto (default: 4 MiB on loopback), bytes, or 0 "
                             "(one message); 262144 is the part size between hosts")
    parser.add_argument("--wire_shared_memory", choices=("auto", "off"), default="auto",
                        help="auto (default): the pushes' tensors travel through shared memory (the ps is on "
                             "loopback); off: through the socket, as between hosts")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        kind, port = args.serve[0], int(args.serve[1])
        (serve_tcp if kind == "tcp" else serve_zmq)(port)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s <= 0 or s % 4 for s in sizes):
        parser.error(f"--sizes must be positive multiples of 4 bytes (float32), got {args.sizes}")

    def log(line: str) -> None:
        print(line, flush=True)

    log(f"ps_bandwidth: Shoal push+pull vs raw TCP, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}, "
        f"session part size {part_bytes_name(args.part_bytes)}, shared memory {args.wire_shared_memory}")
    log(_COLUMNS)
    started = time.monotonic()
    report = run(sizes, log, args.part_bytes, args.wire_shared_memory == "auto")
    report["wall_s"] = round(time.monotonic() - started, 1)
    log(f"tiny_vs_bare_zmq = {report['tiny_vs_bare_zmq']} (goal <= {TINY_GOAL}); "
        f"goals met: {report['goals_met']}; {report['wall_s']} s")
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
