"""The lease size when none is given: 32 batches, at most a 16th of the data set, at least a batch."""

import pytest

from shoal.train.leased_data import default_lease_size


@pytest.mark.parametrize("num_examples, batch_size, expected", [
    (60000, 100, 3200),  # MNIST: 32 batches, well under a 16th (3750)
    (1797, 64, 112),     # sklearn's digits: a 16th of the set, not the whole epoch to the first worker
    (50, 100, 100),      # fewer examples than a batch: one batch (ps 0 grants what there is)
])
def test_default_lease_size(num_examples, batch_size, expected):
    assert default_lease_size(num_examples, batch_size) == expected


def test_a_position_count_replaces_the_32_batches_and_keeps_the_cap():
    assert default_lease_size(60000, 1, 1024) == 1024  # LeasedSampler's, one position at a time
    assert default_lease_size(1797, 1, 1024) == 112
