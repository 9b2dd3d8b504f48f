from shoal.wire.ledger import ConnState, HandshakeLedger


def ledger(per_address=2, total=10, handshake_s=10.0):
    return HandshakeLedger(per_address, total, handshake_s)


def test_over_the_per_address_bound_the_oldest_of_that_address_is_evicted():
    book = ledger(per_address=2)
    assert book.accepted(10, "10.0.0.1", 1, now=0.0) == []
    assert book.accepted(11, "10.0.0.2", 1, now=0.1) == []
    assert book.accepted(12, "10.0.0.1", 2, now=0.2) == []
    victims = book.accepted(13, "10.0.0.1", 3, now=0.3)
    assert [v.fd for v in victims] == [10] and victims[0].state is ConnState.EVICTED
    assert book.unauthenticated(0.3, "10.0.0.1") == 2 and book.unauthenticated(0.3, "10.0.0.2") == 1


def test_trusted_connection_no_longer_counts():
    book = ledger(per_address=1)
    book.accepted(10, "h", 1, now=0.0)
    book.trusted(10)
    assert book.accepted(11, "h", 2, now=0.1) == []
    assert book.unauthenticated(0.1, "h") == 1


def test_approval_offsets_an_unconfirmed_connection_until_its_message_arrives():
    book = ledger(per_address=1)
    book.accepted(10, "h", 1, now=0.0)
    book.approved("h", now=0.05)  # 10 authenticated; its first message is not here yet
    assert book.accepted(11, "h", 2, now=0.1) == []
    book.trusted(10)  # uses up the approval
    assert book.unauthenticated(0.1, "h") == 1
    assert [v.fd for v in book.accepted(12, "h", 3, now=0.2)] == [11]


def test_connection_older_than_the_handshake_timeout_counts_as_authenticated():
    book = ledger(per_address=1, handshake_s=10.0)
    book.accepted(10, "h", 1, now=0.0)
    assert book.accepted(11, "h", 2, now=10.5) == []  # zmq would have dropped 10 if it had not authenticated


def test_total_bound_evicts_the_oldest_unauthenticated_across_addresses():
    book = ledger(per_address=5, total=3)
    for fd, host in ((10, "a"), (11, "b"), (12, "c")):
        assert book.accepted(fd, host, 1, now=fd / 100) == []
    book.trusted(10)
    assert book.accepted(13, "d", 1, now=0.2) == []
    assert [v.fd for v in book.accepted(14, "e", 1, now=0.3)] == [11]
    assert book.unauthenticated(0.3) == 3


def test_closed_connection_frees_its_slot_and_its_fd_can_be_reused():
    book = ledger(per_address=1)
    book.accepted(10, "h", 1, now=0.0)
    book.closed(10)
    book.closed(10)  # idempotent
    assert book.accepted(10, "h", 2, now=0.1) == []
    assert book.unauthenticated(0.1, "h") == 1 and len(book) == 1


def test_fd_reused_without_a_close_event_replaces_the_old_connection():
    book = ledger(per_address=1)
    book.accepted(10, "h", 1, now=0.0)
    assert book.accepted(10, "h", 2, now=0.1) == []
    assert book.unauthenticated(0.1, "h") == 1


def test_evicted_connection_does_not_count_and_is_not_evicted_twice():
    book = ledger(per_address=1)
    book.accepted(10, "h", 1, now=0.0)
    assert [v.fd for v in book.accepted(11, "h", 2, now=0.1)] == [10]
    assert [v.fd for v in book.accepted(12, "h", 3, now=0.2)] == [11]
    book.closed(10)
    assert book.unauthenticated(0.2, "h") == 1
