"""`OutputBuffer` (issue 11): a remote task's output held for a slow console, bounded, dropping the
oldest, with a note in the stream where output went missing."""

import threading

from shoal.launch.output_buffer import CHUNK_OVERHEAD_BYTES, OutputBuffer, dropped_note


def drain(buffer):
    out = []
    while (chunk := buffer.get()) is not None:
        out.append(chunk)
    return out


def test_put_drops_the_oldest_past_the_limit_and_get_notes_the_gap_where_it_was():
    limit = 2 * (5 + CHUNK_OVERHEAD_BYTES)  # two chunks of 5 bytes
    buffer = OutputBuffer("worker.1", limit_bytes=limit)
    for chunk in (b"aaaa\n", b"bbbb\n", b"cccc\n"):
        buffer.put(chunk)
    assert buffer.get() == dropped_note("worker.1", 5, limit)  # "aaaa\n" went; the note comes first
    assert buffer.get() == b"bbbb\n"
    for chunk in (b"dddd\n", b"eeee\n"):
        buffer.put(chunk)  # "cccc\n" goes: a second gap, after what was read
    buffer.end()
    assert drain(buffer) == [dropped_note("worker.1", 5, limit), b"dddd\n", b"eeee\n"]
    assert buffer.dropped == 10


def test_a_chunk_larger_than_the_limit_is_kept_whole_and_put_after_end_is_ignored():
    buffer = OutputBuffer("worker.1", limit_bytes=4)
    buffer.put(b"ab\n")
    buffer.put(b"0123456789\n")
    buffer.end()
    buffer.put(b"late\n")
    assert drain(buffer) == [dropped_note("worker.1", 3, 4), b"0123456789\n"]


def test_get_waits_for_a_put_from_another_thread_and_returns_none_at_the_end():
    buffer = OutputBuffer("worker.1")
    got = []
    reader = threading.Thread(target=lambda: got.extend(drain(buffer)))
    reader.start()
    buffer.put(b"hello\n")
    buffer.end()
    reader.join(10)
    assert not reader.is_alive() and got == [b"hello\n"]


def test_many_tiny_chunks_count_their_overhead_so_what_is_held_stays_bounded():
    """A task that flushes short lines sends tiny chunks; each costs memory beyond its bytes."""
    buffer = OutputBuffer("worker.1", limit_bytes=100 * (2 + CHUNK_OVERHEAD_BYTES))
    for _ in range(10_000):
        buffer.put(b"x\n")
    buffer.end()
    held = drain(buffer)
    assert held[0] == dropped_note("worker.1", 2 * 9_900, buffer.limit_bytes) and len(held) == 1 + 100


def test_a_note_after_a_chunk_that_ended_mid_line_starts_a_line_of_its_own():
    buffer = OutputBuffer("worker.1", limit_bytes=2 * (3 + CHUNK_OVERHEAD_BYTES))
    buffer.put(b"ab\nc")  # agent chunks need not end on a line break
    assert buffer.get() == b"ab\nc"
    for chunk in (b"de\n", b"fg\n", b"hi\n"):
        buffer.put(chunk)
    assert buffer.get() == b"\n" + dropped_note("worker.1", 3, buffer.limit_bytes)


def test_a_note_put_after_a_line_left_open_starts_a_line_of_its_own():
    buffer = OutputBuffer("worker.1")
    buffer.put(b"step 7")
    buffer.put_line(b"shoal: lost the agent\n")
    buffer.put(b"done\n")
    buffer.put_line(b"shoal: again\n")
    buffer.end()
    assert b"".join(iter(buffer.get, None)) == b"step 7\nshoal: lost the agent\ndone\nshoal: again\n"
