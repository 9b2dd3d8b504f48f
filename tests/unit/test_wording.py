"""`counted`: a count and its noun, plural unless the count is 1; `byte_size`: bytes as a person reads them."""

import pytest

from shoal.wording import byte_size, counted


@pytest.mark.parametrize("count, noun, text", [
    (1, "task", "1 task"), (0, "task", "0 tasks"), (2, "GPU", "2 GPUs"), (-1, "step", "-1 steps"),
    (1, "more gradient", "1 more gradient"), (3, "finished job", "3 finished jobs")])
def test_counted_names_the_count_with_its_noun_plural_unless_it_is_one(count, noun, text):
    assert counted(count, noun) == text


@pytest.mark.parametrize("nbytes, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (31_360, "30.6 KiB"),
                                          (814_120, "795.0 KiB"), (3 << 20, "3.0 MiB"), (5 << 30, "5.0 GiB")])
def test_byte_size_picks_the_largest_unit_that_is_at_least_one(nbytes, text):
    assert byte_size(nbytes) == text
