"""Leases in the real Redis: capacity, renew, release, expiry and reclaim, under concurrent callers."""

import threading
import time

import pytest
import redis

from sandbox.leases import LeaseExpired, LeaseNotFound, LeaseStore, NoCapacity, NotLeaseOwner

from .conftest import REDIS_TEST_URL


@pytest.fixture
def store(client, namespace):
    return LeaseStore(client, capacity=3, namespace=namespace)


def test_acquire_renew_release(store):
    lease = store.acquire("alice", ttl_s=30)
    assert store.live_count() == 1
    renewed = store.renew(lease.session_id, "alice")
    assert renewed.expires_ms >= lease.expires_ms
    with pytest.raises(NotLeaseOwner):
        store.renew(lease.session_id, "mallory")
    with pytest.raises(NotLeaseOwner):
        store.release(lease.session_id, "mallory")
    store.release(lease.session_id, "alice")
    assert store.live_count() == 0
    with pytest.raises(LeaseNotFound):
        store.release(lease.session_id, "alice")


def test_capacity_is_a_clear_answer(store):
    for _ in range(3):
        store.acquire("bob", ttl_s=30)
    with pytest.raises(NoCapacity, match="all 3 sessions are leased"):
        store.acquire("bob", ttl_s=30)


def test_expired_leases_free_capacity_and_are_reclaimed_once(store):
    short = store.acquire("carol", ttl_s=0.05)
    store.acquire("carol", ttl_s=30)
    store.acquire("carol", ttl_s=30)
    time.sleep(0.1)
    with pytest.raises(LeaseExpired):
        store.renew(short.session_id, "carol")
    store.acquire("dave", ttl_s=30)  # the expired slot no longer counts
    assert store.reclaim_expired() == [short.session_id]
    assert store.reclaim_expired() == []
    with pytest.raises(LeaseNotFound):
        store.renew(short.session_id, "carol")


def test_concurrent_callers_never_exceed_capacity(namespace):
    granted, refused = [], []
    barrier = threading.Barrier(16)

    def grab(n):
        own = LeaseStore(redis.Redis.from_url(REDIS_TEST_URL), capacity=5, namespace=namespace)
        barrier.wait()
        try:
            granted.append(own.acquire(f"user{n}", ttl_s=30))
        except NoCapacity:
            refused.append(n)

    threads = [threading.Thread(target=grab, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(granted), len(refused)) == (5, 11)
    assert len({lease.session_id for lease in granted}) == 5
