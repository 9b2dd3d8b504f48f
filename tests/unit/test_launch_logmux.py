"""LogMux: whole prefixed lines from pieces, a last line without newline, progress, a log file
that cannot be written."""

import io
import os

import pytest

from shoal.launch.logmux import PROGRESS_RE, LogMux


def pump(mux, pieces, tmp_path, name="worker.0"):
    read_fd, write_fd = os.pipe()
    thread = mux.attach(f"j.{name}", name, os.fdopen(read_fd, "rb"), str(tmp_path / f"{name}.log"))
    for piece in pieces:
        os.write(write_fd, piece)
    os.close(write_fd)
    thread.join(5)
    assert not thread.is_alive()


def test_pieces_of_lines_come_out_as_whole_prefixed_lines(tmp_path):
    out = io.BytesIO()
    pump(LogMux(out), [b"hel", b"lo\nwor", b"ld\r\n", b"\n", b"tail"], tmp_path)
    assert out.getvalue() == (b"j.worker.0 | hello\nj.worker.0 | world\r\n"
                              b"j.worker.0 | \nj.worker.0 | tail\n")
    assert (tmp_path / "worker.0.log").read_bytes() == b"hello\nworld\r\n\ntail\n"


def test_carriage_returns_do_not_split_lines(tmp_path):
    out = io.BytesIO()
    pump(LogMux(out), [b"10%\r20%\r100%\n"], tmp_path)
    assert out.getvalue() == b"j.worker.0 | 10%\r20%\r100%\n"


def test_progress_lines_are_reported_with_step_and_loss(tmp_path):
    seen = []
    mux = LogMux(io.BytesIO(), on_progress=lambda name, p: seen.append((name, p.step, p.loss)))
    pump(mux, [b"step=10 loss=0.5 lr=0.1\nnothing\n", b"step=20 acc=1 loss=2.5e-1\n"], tmp_path)
    # the newest progress line of each chunk read is reported; pieces may be coalesced
    assert seen[-1] == ("worker.0", 20, 0.25)
    assert set(seen) <= {("worker.0", 10, 0.5), ("worker.0", 20, 0.25)}


def test_progress_regex_accepts_nan_and_requires_whole_words():
    assert PROGRESS_RE.search(b"step=3 loss=nan").groups() == (b"3", b"nan")
    assert PROGRESS_RE.search(b"substep=3 loss=1") is None


def test_live_status_line_is_cleared_before_log_lines(tmp_path):
    out = io.BytesIO()
    mux = LogMux(out, live_status=True)
    mux.set_status("[j] step 1")
    pump(mux, [b"a\n"], tmp_path)
    assert out.getvalue().endswith(b"\r\x1b[Kj.worker.0 | a\n[j] step 1")


# --- bounded lines: long lines, endless output without a newline, \r progress bars ----

LIMIT = 1 << 16  # logmux.MAX_LINE; a line longer than this is shown in pieces


class Console:
    """A console that keeps only what the checks need: every write's size and line sizes."""

    def __init__(self):
        self.writes = []
        self.longest_line = 0
        self.total = 0
        self.whole_lines = True

    def write(self, data):
        self.writes.append(len(data))
        self.total += len(data)
        self.longest_line = max(self.longest_line, max(map(len, data.split(b"\n"))))
        self.whole_lines &= data.endswith(b"\n")

    def flush(self):
        pass


def wait_for(predicate, what, timeout=60.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_endless_output_without_newline_reaches_log_in_bounded_pieces(tmp_path):
    import subprocess
    import sys

    size = 50 * 2**20
    writer = ("import sys\nsys.stdout.buffer.write(b'x' * %d)\nsys.stdout.flush()\n"
              "sys.stdin.read()\n" % size)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    console = Console()
    log = tmp_path / "worker.0.log"
    try:
        thread = LogMux(console).attach("j.worker.0", "worker.0", proc.stdout, str(log))
        # the writer is still running (blocked on stdin): no newline and no EOF yet
        wait_for(lambda: log.exists() and log.stat().st_size >= size, "the log to fill")
        assert proc.poll() is None
        wait_for(lambda: console.total >= size * 0.99, "the console to show it")
        assert console.whole_lines
        assert console.longest_line <= len(b"j.worker.0 | ") + LIMIT
        assert max(console.writes) <= 2 * (LIMIT + 64)
    finally:
        proc.stdin.close()
        proc.wait(30)
    thread.join(30)
    assert not thread.is_alive()
    assert log.stat().st_size == size + 1  # the last line was completed with "\n"
    with open(log, "rb") as f:
        assert f.read(4096) == b"x" * 4096 and (f.seek(-2, 2), f.read())[1] == b"x\n"


def test_long_line_is_shown_as_bounded_prefixed_pieces(tmp_path):
    out = io.BytesIO()
    line = bytes(range(97, 123)) * 20000  # 520 kB, one line
    pump(LogMux(out), [line + b"\nnext\n"], tmp_path)
    shown = out.getvalue().split(b"\n")[:-1]
    assert all(piece.startswith(b"j.worker.0 | ") for piece in shown)
    assert all(len(piece) <= len(b"j.worker.0 | ") + LIMIT for piece in shown)
    assert b"".join(piece[len(b"j.worker.0 | "):] for piece in shown) == line + b"next"
    assert (tmp_path / "worker.0.log").read_bytes() == line + b"\nnext\n"


def test_long_line_is_not_cut_inside_a_utf8_character(tmp_path):
    out = io.BytesIO()
    line = "é".encode() * LIMIT  # 2 bytes each: any cut at an odd offset would split one
    pump(LogMux(out), [b"x" + line + b"\n"], tmp_path)
    for piece in out.getvalue().split(b"\n")[:-1]:
        piece.decode("utf-8")  # raises if a character was cut


def test_carriage_return_shows_a_partial_line_before_its_newline(tmp_path):
    out = io.BytesIO()
    read_fd, write_fd = os.pipe()
    thread = LogMux(out).attach("j.worker.0", "worker.0", os.fdopen(read_fd, "rb"),
                                str(tmp_path / "worker.0.log"))
    try:
        os.write(write_fd, b"10%|#\r")  # a progress bar's update: no newline yet
        wait_for(lambda: out.getvalue(), "the progress update", timeout=30)
        assert out.getvalue() == b"j.worker.0 | 10%|#\r\n"
    finally:
        os.write(write_fd, b"\n20%|##\n")
        os.close(write_fd)
    thread.join(5)
    # the "\n" that completes the shown "\r" adds no empty line
    assert out.getvalue() == b"j.worker.0 | 10%|#\r\nj.worker.0 | 20%|##\n"
    assert (tmp_path / "worker.0.log").read_bytes() == b"10%|#\r\n20%|##\n"


def test_summaries_line_reports_the_tasks_directory(tmp_path):
    seen = []
    mux = LogMux(io.BytesIO(), on_summaries=lambda *a: seen.append(a))
    pump(mux, [b"step=1 loss=1\nsummaries=/x/my dir/worker_1\r\n",
               b"we write summaries=/not/this\nsummaries=relative/no\n"], tmp_path, "worker.1")
    assert seen == [("worker.1", "/x/my dir/worker_1")]


@pytest.mark.skipif(not os.path.exists("/dev/full"),
                    reason="needs /dev/full (Linux), where every write fails with ENOSPC")
def test_lines_and_progress_still_flow_with_one_note_when_the_log_cannot_be_written():
    out = io.BytesIO()
    seen = []
    mux = LogMux(out, on_progress=lambda name, p: seen.append(p.step))
    read_fd, write_fd = os.pipe()
    thread = mux.attach("j.worker.0", "worker.0", os.fdopen(read_fd, "rb"), "/dev/full",
                        header=b"shoal | attempt 2 starts (restarted)\n")
    for step in range(1, 6):
        os.write(write_fd, b"step=%d loss=0.5\n" % step)
        wait_for(lambda: seen and seen[-1] == step, f"progress line {step}", timeout=10)
    os.write(write_fd, b"tail")
    os.close(write_fd)
    thread.join(30)
    assert not thread.is_alive()
    lines = out.getvalue().decode().splitlines()
    notes = [line for line in lines if line.startswith("shoal | ")]
    assert notes == ["shoal | j.worker.0: cannot write its log /dev/full: No space left on device;"
                     " its lines still show here, and are no longer kept in the file"
                     " (free space on that disk for later logs)"]
    assert [line for line in lines if not line.startswith("shoal | ")] == \
        [f"j.worker.0 | step={step} loss=0.5" for step in range(1, 6)] + ["j.worker.0 | tail"]
