"""Oracle demonstrations (sandbox/suite/demos.py) on the real sandbox service: the episodes are in the trainer's
format, solved (reward 1), their clicks land on outlined elements whose line the thought names, and they render for
the agent with screenshots."""

import uuid

import pytest

from sandbox.client import SandboxClient
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.suite import make_task
from sandbox.suite.demos import record_demos
from training.agent import AgentConfig, build_agent
from training.data import Renderer, read_episodes
from training.models import load_tokenizer

from ..servers import sandbox_service

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)
API_KEY = "test-key-" + uuid.uuid4().hex


def test_oracle_demonstrations_are_solved_sft_episodes_with_the_outline(tmp_path):
    tasks = [make_task("click-button", 1, "train", 1), make_task("type-field", 2, "train", 3)]
    with sandbox_service(tmp_path / "sessions", tmp_path, API_KEY, warm=0) as url:
        client = SandboxClient(url, API_KEY, owner="demos-test")
        progress: list[tuple[int, int]] = []
        result = record_demos(client, tasks, tmp_path / "demos" / "sft.jsonl", on_episode=lambda *a: progress.append(a))
        client.close()
    assert (result.episodes, result.failed, progress) == (2, [], [(1, 2), (2, 2)])
    episodes = list(read_episodes(tmp_path / "demos" / "sft.jsonl"))
    assert [e.reward for e in episodes] == [1.0, 1.0] and {e.source for e in episodes} == {"demonstration"}
    assert result.steps == sum(e.turns for e in episodes) and episodes[1].turns >= 4  # focus, select, type, finish
    for episode in episodes:
        assert episode.messages[0]["content"].endswith(episode.instruction + "\n")
        assert episode.messages[-1]["content"].split("Action: ")[1].startswith("finished(")
        for before, reply in zip(episode.messages[1::2], episode.messages[2::2], strict=True):
            outline = before["content"][1]["text"]
            if "Action: click(" in reply["content"]:
                point = reply["content"].split("<|box_start|>")[1].split("<|box_end|>")[0]
                named = reply["content"].split("Thought: I click ")[1].split(".\nAction")[0]
                assert named in outline.splitlines() and named.endswith(point)
    tokenizer, processor = load_tokenizer(build_agent(tmp_path / "agent", AgentConfig(hidden=32, layers=1, heads=1)))
    sample = Renderer(tokenizer, image_processor=processor).render(episodes[1])
    assert sample.image_grid_thw is not None and sample.image_grid_thw.shape[0] == episodes[1].turns
