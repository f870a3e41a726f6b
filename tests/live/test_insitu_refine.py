"""Think-aloud refinement through the real embedded policy server: each spoken step's thought is the model's rewrite,
the raw transcript stays beside it, and a server that fails leaves the raw thoughts with a warning. The server runs a
stub checkpoint whose greedy answer is known by construction, so the test knows what each refined thought must be."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from annotation_app.insitu import pipeline
from annotation_app.insitu.refine import refine_request
from flywheel.models import ModelVersion
from training.policy.tiny import build_tiny_checkpoint

from ..insitu.captures import SCRIPT, SCRIPT_WER, scripted, upload, wer
from ..servers import answers, free_port, running, subprocess_env

pytestmark = pytest.mark.slow

STUB_ANSWER = "Stub answer."  # every character once: greedy decoding walks a chain through them (see below)


def build_stub_checkpoint(path: Path, answer: str = STUB_ANSWER) -> Path:
    """The tiny UI-TARS checkpoint rewired so that greedy decoding answers `answer` to any chat prompt.

    Attention and MLP outputs are zeroed, so the last hidden state is the last token's embedding (normalised). The
    chain newline (the generation prompt's last token) -> answer's characters -> <|im_end|> gives each of its tokens
    its own basis direction as embedding, and the LM head maps each direction to the next token of the chain and
    nothing else: the next token depends on the current one only, and the answer follows whatever was asked.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    build_tiny_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    chain = tokenizer("\n" + answer, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    assert len(set(chain)) == len(chain) == len(answer) + 2, "each character of the answer must be one token, once"
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    text = model.model.language_model
    with torch.no_grad():
        for layer in text.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        text.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for direction, (token, following) in enumerate(itertools.pairwise(chain)):
            text.embed_tokens.weight[token] = 0.0
            text.embed_tokens.weight[token, direction] = 10.0
            model.lm_head.weight[following, direction] = 1.0
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def stub_policy_url(tmp_path_factory) -> str:
    """The embedded policy server, as the Procfile runs it, on the stub checkpoint; yields its OpenAI base URL."""
    checkpoint = build_stub_checkpoint(tmp_path_factory.mktemp("models") / "stub-refiner")
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(checkpoint)]
    command += ["--name", "tiny-uitars", "--port", str(port), "--threads", "1"]
    log = tmp_path_factory.mktemp("logs") / "stub-policy.log"
    with running(command, subprocess_env(), log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


def _model(url: str) -> ModelVersion:
    model = ModelVersion.objects.create(name="tiny-refiner", checkpoint_uri="tiny", endpoint_url=url,
                                        served_name="tiny-uitars")  # fmt: skip
    model.promote()
    return model


@pytest.mark.django_db(transaction=True)
def test_refined_thoughts_come_from_the_policy_server_and_the_raw_transcript_is_kept(
    api, media, tmp_path, settings, stub_policy_url
):
    settings.INSITU_REFINE = True
    _model(stub_policy_url)
    builder = scripted(tmp_path)
    state = upload(api, builder.archive(), builder.session_id, instruction=builder.instruction)
    capture = pipeline.process(state["id"])
    assert capture.status == "ready", capture.error
    assert not [w for w in capture.warnings if "refinement" in w], capture.warnings
    steps = list(capture.trajectory.steps.order_by("index"))
    assert len(steps) == len(capture.alignment) == len(SCRIPT)
    for step, aligned, sentence in zip(steps, capture.alignment, SCRIPT, strict=True):
        assert wer(sentence, aligned["raw"]) <= SCRIPT_WER  # the transcript itself is kept, untouched
        assert aligned["refined"] == step.thought == STUB_ANSWER  # the model's answer replaced the spoken thought
    body = refine_request("m", builder.instruction, capture.alignment[0]["raw"], steps[0].action_text)
    assert capture.alignment[0]["raw"] in body["messages"][1]["content"] and body["temperature"] == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_failing_policy_server_leaves_the_raw_thoughts_and_says_so(api, media, tmp_path, settings):
    settings.INSITU_REFINE, settings.POLICY_TIMEOUT_S = True, 2
    _model(f"http://127.0.0.1:{free_port()}/v1")  # nobody listens there
    builder = scripted(tmp_path)
    state = upload(api, builder.archive(), builder.session_id, instruction=builder.instruction)
    capture = pipeline.process(state["id"])
    assert capture.status == "ready", capture.error
    assert any("refinement stopped at step 0" in w for w in capture.warnings), capture.warnings
    steps = list(capture.trajectory.steps.order_by("index"))
    assert [s.thought for s in steps] == [a["raw"] for a in capture.alignment]
    assert all(a["refined"] is None for a in capture.alignment)
