"""LogMux: whole prefixed lines from pieces, a last line without newline, progress."""

import io
import os

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
    mux = LogMux(io.BytesIO(), on_progress=lambda *a: seen.append(a))
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
