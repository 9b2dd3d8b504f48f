"""`counted`: a count and its noun, plural unless the count is 1."""

import pytest

from shoal.wording import counted


@pytest.mark.parametrize("count, noun, text", [
    (1, "task", "1 task"), (0, "task", "0 tasks"), (2, "GPU", "2 GPUs"), (-1, "step", "-1 steps"),
    (1, "more gradient", "1 more gradient"), (3, "finished job", "3 finished jobs")])
def test_counted_names_the_count_with_its_noun_plural_unless_it_is_one(count, noun, text):
    assert counted(count, noun) == text
