"""`shoal logs` printing a task's log (cmd_logs._copy): exactly, in reads of bounded size
(a log many times a read costs about one read of memory), and from the start again after the
file was truncated."""

import hashlib
import io
import tracemalloc

from shoal.cli import cmd_logs
from shoal.cli.environment import Environment


class Sink:
    """stdout_bytes that keeps only a hash of what was written (no memory)."""

    def __init__(self):
        self.hash = hashlib.sha256()

    def write(self, data):
        self.hash.update(data)

    def flush(self):
        pass


def env_with(tmp_path, stdout_bytes):
    return Environment(environ={"SHOAL_HOME": str(tmp_path / "home")}, stdout=io.StringIO(),
                       stderr=io.StringIO(), stdout_bytes=stdout_bytes, cwd=tmp_path)


def test_log_of_many_reads_is_printed_exactly_with_its_last_line_completed(tmp_path, monkeypatch):
    monkeypatch.setattr(cmd_logs, "_MAX_READ", 1000)
    lines = [b"line %d " % i + b"x" * (i % 300) for i in range(200)]
    lines[50] = b"long " + b"y" * 2500  # longer than a read: printed whole all the same
    data = b"\n".join(lines)  # the last line has no newline
    log = tmp_path / "worker.0.log"
    log.write_bytes(data)
    out = io.BytesIO()
    env = env_with(tmp_path, out)
    assert cmd_logs._copy(log, 0, b"", env, final=True) == len(data)
    assert out.getvalue() == data + b"\n"
    out.seek(0), out.truncate()
    assert cmd_logs._copy(log, 0, b"j.worker.0 | ", env, final=True) == len(data)
    assert out.getvalue() == b"".join(b"j.worker.0 | " + line + b"\n" for line in lines)


def test_log_without_final_keeps_its_unfinished_last_line_for_later(tmp_path, monkeypatch):
    monkeypatch.setattr(cmd_logs, "_MAX_READ", 10)
    log = tmp_path / "worker.0.log"
    log.write_bytes(b"one\ntwo\nthree\nfou")
    out = io.BytesIO()
    assert cmd_logs._copy(log, 0, b"p | ", env_with(tmp_path, out)) == 14
    assert out.getvalue() == b"p | one\np | two\np | three\n"


def test_log_many_times_a_read_is_printed_in_bounded_memory(tmp_path):
    line = b"step=1 loss=0.5 " + b"z" * 100 + b"\n"
    per_read = cmd_logs._MAX_READ // len(line)
    log = tmp_path / "worker.0.log"
    with open(log, "wb") as f:
        for _ in range(32):
            f.write(line * per_read)
    prefix = b"j.worker.0 | "
    want = hashlib.sha256()
    for _ in range(32):
        want.update((prefix + line) * per_read)
    sink = Sink()
    tracemalloc.start()
    try:
        offset = cmd_logs._copy(log, 0, prefix, env_with(tmp_path, sink), final=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert offset == log.stat().st_size and sink.hash.digest() == want.digest()
    assert peak < 6 * cmd_logs._MAX_READ, f"{peak} bytes at the peak to print a {offset}-byte log"


def test_truncated_log_is_printed_again_from_its_start_after_a_note(tmp_path):
    log = tmp_path / "worker.0.log"
    log.write_bytes(b"one\ntwo\n")
    out = io.BytesIO()
    env = env_with(tmp_path, out)
    offset = cmd_logs._copy(log, 0, b"", env)
    log.write_bytes(b"new\n")  # truncated (as `: > log` does), then written again
    assert cmd_logs._copy(log, offset, b"", env) == 4
    assert out.getvalue() == b"one\ntwo\nnew\n"
    assert env.stderr.getvalue() == f"({log} was truncated; following it from its start)\n"
