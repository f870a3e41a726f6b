"""Rollouts with the real tiny model: the agent loop, the batching local policy, and the streaming pool's staleness."""

from __future__ import annotations

import threading

import pytest

from training.data import Episode, Renderer
from training.envs import CopyEnv, GuessEnv, make_text_env
from training.models import load_actor, load_tokenizer
from training.rollout import (
    LocalPolicy,
    Reply,
    RolloutPool,
    SamplingParams,
    StalenessManager,
    collect_sync,
    episode_return,
    run_episode,
)


@pytest.fixture(scope="module")
def policy(tiny_text):
    tokenizer, _ = load_tokenizer(tiny_text)
    return LocalPolicy(load_actor(tiny_text), Renderer(tokenizer), SamplingParams(max_new_tokens=4))


def test_environments_score_their_experts_fully_and_parse_specs():
    for spec in ("copy:turns=4,length=2", "guess:high=16,tries=5"):
        env = make_text_env(spec)
        episode = run_episode(env, lambda _, env=env: (Reply(env.expert()), 0), seed=7)
        assert episode_return(episode) == pytest.approx(1.0), spec
    assert isinstance(make_text_env("copy:alphabet=xy"), CopyEnv) and make_text_env("guess").high == 8
    with pytest.raises(ValueError, match="unknown environment"):
        make_text_env("chess")


def test_guess_hints_carry_what_the_next_turn_needs():
    env = GuessEnv(high=8, tries=3)
    env.reset(seed=1)
    target = env._target
    wrong = 1 if target != 1 else 2
    feedback = env.step(str(wrong))
    assert feedback.observation == {"role": "user", "content": "higher" if wrong < target else "lower"}
    assert not env.step("seven").done  # an unparsable guess costs a try and says so
    assert env.step(str(target)).reward == 1.0


def test_agent_loop_records_turns_rewards_versions_and_truncation(policy):
    policy.version = 3
    episode = run_episode(CopyEnv(turns=2), policy.generate_one, seed=5)
    assistant = [m for m in episode.messages if m["role"] == "assistant"]
    assert len(assistant) == 2 and all(m["version"] == 3 for m in assistant)
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "user", "assistant"]
    # an untrained model rarely stops within 4 tokens: those turns are marked truncated for the format penalty. The
    # tokenizer is byte-level, so 4 tokens are at least 4 UTF-8 bytes (a partial character decodes to U+FFFD).
    assert all(len(m["content"].encode()) >= 4 for m in assistant if m.get("truncated")), assistant
    policy.version = 0


def test_concurrent_requests_are_batched_into_fewer_generate_calls(policy):
    calls = []
    original = policy.generate

    def counting(conversations):
        calls.append(len(conversations))
        return original(conversations)

    policy.generate = counting
    try:
        env = CopyEnv(turns=1)
        threads = [threading.Thread(target=lambda: policy.generate_one(env.reset(1))) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        del policy.generate
    assert sum(calls) == 12 and len(calls) < 12


def test_sync_batches_end_with_their_longest_episode(policy):
    episodes = collect_sync(lambda: CopyEnv(turns=3, tail=1.0), policy, seeds=[1, 2, 3, 4])
    assert [e.meta["seed"] for e in episodes] == [1, 2, 3, 4]
    lengths = {e.turns for e in episodes}
    assert len(lengths) > 1  # long-tailed turn counts


def test_admission_rule_bounds_how_far_rollouts_run_ahead():
    manager = StalenessManager(batch_size=4, max_staleness=1)
    stop = threading.Event()
    assert all(manager.acquire(stop) for _ in range(8))  # (1 + 0 + 1) · 4 episodes may start at version 0
    assert manager.capacity() == 0
    manager.advance(1)
    assert manager.capacity() == 4
    old = Episode(messages=[{"role": "assistant", "content": "a", "version": 0}])
    manager.advance(2)
    assert not manager.is_stale(Episode(messages=[{"role": "assistant", "content": "a", "version": 1}]))
    assert manager.is_stale(old)
    stop.set()
    manager.capacity = lambda: 0  # type: ignore[method-assign]
    assert manager.acquire(stop) is False  # a stopped pool never blocks forever


def test_streaming_pool_hands_out_batches_within_the_staleness_bound(policy):
    with RolloutPool(lambda: CopyEnv(turns=2, tail=1.0, latency_s=0.002), policy, batch_size=6, concurrency=10,
                     max_staleness=1) as pool:  # fmt: skip
        for version in range(1, 4):
            batch = pool.take(6, timeout_s=120)
            assert len(batch) == 6
            starts = [min(m["version"] for m in e.messages if m["role"] == "assistant") for e in batch]
            assert all(version - 1 - s <= 1 for s in starts), starts
            pool.set_version(version)
        assert pool.staleness.started <= (1 + 3 + 1) * 6
    assert pool.stats.taken == 18 and pool.stats.failed == 0


class Exploding(CopyEnv):
    def step(self, reply: str):
        raise RuntimeError("desktop crashed")


def test_a_failing_environment_loses_its_episode_not_the_pool(policy):
    with RolloutPool(lambda: Exploding(turns=1), policy, batch_size=2, concurrency=2, max_staleness=0) as pool:
        with pytest.raises(TimeoutError, match="desktop crashed"):
            pool.take(1, timeout_s=3)
    assert pool.stats.failed >= 1
