"""The registry's state changes (flywheel.registry): registering a trained model with its lineage is idempotent and
makes it servable on the real embedded policy server; evaluations are recorded beside the parent's; automatic
promotion happens exactly when the new model's held-out success rate is strictly higher than the active model's;
promote, roll back and demote keep one active model and write the history."""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from flywheel import registry
from flywheel.models import DatasetVersion, Iteration, ModelPromotion, ModelVersion
from flywheel.serving import serving_problem
from training.policy.tiny import build_tiny_checkpoint

from ..servers import answers, free_port, running, subprocess_env

pytestmark = pytest.mark.django_db

CLOSED = "http://127.0.0.1:9/v1"  # nothing listens on the discard port


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    """A models root with two tiny checkpoints: the one the server starts with, and one 'trained by an iteration'."""
    root = tmp_path_factory.mktemp("flywheel-runs")
    build_tiny_checkpoint(root / "base")
    shutil.copytree(root / "base", root / "iteration-1" / "sft" / "model")
    shutil.copytree(root / "base", root / "iteration-1" / "sft" / "retrained")
    return root


@pytest.fixture(scope="module")
def policy_server(models_root, tmp_path_factory):
    """The embedded policy server as the Procfile runs it (loads checkpoints from under --models-root)."""
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(models_root / "base")]
    command += ["--name", "base", "--port", str(port), "--threads", "1", "--models-root", str(models_root)]
    log = tmp_path_factory.mktemp("logs") / "policy.log"
    with running(command, subprocess_env(), log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


def _iteration(user=None, base: ModelVersion | None = None) -> Iteration:
    iteration = Iteration.objects.create(
        started_by=user, base_model=base, selected_stages=["validate", "export", "sft", "evaluate"]
    )
    for kind in ("sft", "ct"):
        DatasetVersion.objects.create(kind=kind, number=1, iteration=iteration, row_count=3, added_count=3)
    return iteration


def _result(rate: float, episodes: int = 10) -> dict:
    successes = round(rate * episodes)
    return {
        "success_rate": rate, "ci_low": max(rate - 0.2, 0.0), "ci_high": min(rate + 0.2, 1.0),
        "successes": successes, "episodes": episodes, "mean_return": rate, "by_task": {"t1": rate},
    }  # fmt: skip


def test_register_model_is_idempotent_records_lineage_and_loads_it_into_the_policy_server(
    settings, policy_server, models_root, make_user
):
    settings.EMBEDDED_POLICY_URL = policy_server
    engineer = make_user("ml_engineer")
    base = ModelVersion.objects.create(name="base", checkpoint_uri=str(models_root / "base"))
    iteration = _iteration(engineer, base)
    checkpoint = str(models_root / "iteration-1" / "sft" / "model")

    model = registry.register_model(iteration, stage="sft", checkpoint=checkpoint, metrics={"loss": 1.5})
    assert model.name == f"it{iteration.pk}-sft" and model.stage == "sft" and model.iteration == iteration
    assert model.parent == base and model.created_by == engineer
    assert {v.kind for v in model.dataset_versions.all()} == {"sft", "ct"}
    assert model.endpoint_url == policy_server and model.served_name == model.name and not model.notes
    assert model.serve_command.startswith(f"vllm serve {checkpoint} --served-model-name {model.name}")
    assert serving_problem(model) is None  # the server lists it: it can be promoted without force

    again = registry.register_model(iteration, stage="sft", checkpoint=checkpoint, metrics={"loss": 1.2})
    assert again.pk == model.pk and again.metrics == {"loss": 1.2}
    assert ModelVersion.objects.filter(iteration=iteration).count() == 1

    registry.promote(model, by=engineer)
    assert ModelVersion.objects.get(is_active=True) == model

    moved = str(models_root / "iteration-1" / "sft" / "retrained")  # the stage ran again into another directory
    again = registry.register_model(iteration, stage="sft", checkpoint=moved, metrics={"loss": 1.1})
    assert again.pk == model.pk and again.checkpoint_uri == moved and again.endpoint_url == policy_server
    cards = {m["id"]: m for m in httpx.get(f"{policy_server}/models").json()["data"]}
    assert cards[model.name]["root"] == str(Path(moved).resolve())  # the same name, the new checkpoint


def test_a_model_the_server_cannot_load_is_registered_without_an_endpoint_and_says_why(settings, tmp_path):
    settings.EMBEDDED_POLICY_URL = CLOSED
    iteration = _iteration()
    model = registry.register_model(iteration, stage="ppo", checkpoint=str(tmp_path / "ppo"), metrics={})
    assert model.endpoint_url == "" and "policy server at http://127.0.0.1:9/v1 could not load" in model.notes
    assert "vllm serve" in model.serve_command and model.parent is None
    with pytest.raises(registry.NotServable, match="has no endpoint URL"):
        registry.promote(model, by=None)


@pytest.mark.parametrize(
    ("stage", "checkpoint", "metrics", "message"),
    [("teleport", "/x", {}, "unknown stage"), ("sft", "", {}, "checkpoint"), ("sft", "/x", [], "JSON object")],
)
def test_register_model_refuses_bad_input(settings, stage, checkpoint, metrics, message):
    settings.EMBEDDED_POLICY_URL = CLOSED
    with pytest.raises(registry.RegistryError, match=message):
        registry.register_model(_iteration(), stage=stage, checkpoint=checkpoint, metrics=metrics)


def test_record_evaluation_keeps_the_parents_result_beside_it():
    parent = ModelVersion.objects.create(name="p", checkpoint_uri="/p")
    model = ModelVersion.objects.create(name="m", checkpoint_uri="/m", parent=parent)
    registry.record_evaluation(model, _result(0.6), _result(0.3))
    model.refresh_from_db()
    assert model.evaluation["new"]["success_rate"] == 0.6 and model.evaluation["parent"]["success_rate"] == 0.3
    assert model.evaluation["parent_id"] == parent.pk
    with pytest.raises(registry.RegistryError, match="success_rate must be a number from 0 to 1"):
        registry.record_evaluation(model, {"success_rate": 1.5}, None)


def _served(name: str, url: str) -> ModelVersion:
    return ModelVersion.objects.create(name=name, checkpoint_uri=f"/{name}", endpoint_url=url, served_name=name)


@pytest.mark.parametrize(
    ("new_rate", "parent_rate", "promoted"),
    [(0.5, 0.3, True), (0.3, 0.3, False), (0.2, 0.3, False)],
    ids=["higher-promotes", "equal-does-not", "lower-does-not"],
)
def test_auto_promote_needs_a_strictly_higher_held_out_success_rate_than_the_active_parent(
    settings, policy_server, models_root, make_user, new_rate, parent_rate, promoted
):
    settings.EMBEDDED_POLICY_URL = policy_server
    engineer = make_user("ml_engineer")
    base = _served("base", policy_server)
    base.promote(by=engineer)
    iteration = _iteration(engineer, base)
    model = registry.register_model(
        iteration, stage="sft", checkpoint=str(models_root / "iteration-1" / "sft" / "model"), metrics={}
    )
    registry.record_evaluation(model, _result(new_rate), _result(parent_rate))

    assert registry.auto_promote(iteration, model) is promoted
    model.refresh_from_db()
    assert model.is_active is promoted and ModelVersion.objects.filter(is_active=True).count() == 1
    decision = model.evaluation["promotion"]
    assert decision["promoted"] is promoted and f"iteration {iteration.pk}" in decision["reason"]
    assert f"{new_rate:.1%} vs {parent_rate:.1%}" in decision["reason"]
    history = ModelPromotion.objects.filter(action=ModelPromotion.Action.AUTO)
    if promoted:
        row = history.get()
        assert (row.from_model, row.to_model, row.by, row.forced) == (base, model, engineer, False)
    else:
        assert not history.exists()


def test_auto_promote_never_promotes_a_model_that_cannot_serve():
    base = ModelVersion.objects.create(name="base", checkpoint_uri="/b")
    base.promote()
    iteration = _iteration(base=base)
    model = ModelVersion.objects.create(name="new", checkpoint_uri="/n", parent=base, iteration=iteration, stage="sft")
    registry.record_evaluation(model, _result(0.9), _result(0.1))
    assert registry.auto_promote(iteration, model) is False
    model.refresh_from_db()
    assert "cannot serve: it has no endpoint URL" in model.evaluation["promotion"]["reason"]
    assert ModelVersion.objects.get(is_active=True) == base


def test_auto_promote_against_an_active_model_that_is_not_the_parent_uses_its_own_evaluation(
    policy_server, models_root, settings
):
    settings.EMBEDDED_POLICY_URL = policy_server
    parent = _served("base", policy_server)
    other = _served("other", policy_server)
    other.promote()
    iteration = _iteration(base=parent)
    checkpoint = str(models_root / "iteration-1" / "sft" / "model")
    model = registry.register_model(iteration, stage="sft", checkpoint=checkpoint, metrics={})
    registry.record_evaluation(model, _result(0.5), _result(0.1))
    assert registry.auto_promote(iteration, model) is False  # `other` has no held-out evaluation to compare with
    assert (
        "has no held-out evaluation to compare with"
        in ModelVersion.objects.get(pk=model.pk).evaluation["promotion"]["reason"]
    )
    registry.record_evaluation(other, _result(0.4), None)
    assert registry.auto_promote(iteration, model) is True  # 50% > 40% (its own evaluation)
    assert ModelVersion.objects.get(is_active=True) == model


def test_promote_roll_back_and_demote_write_the_history(make_user):
    engineer = make_user("ml_engineer")
    first = ModelVersion.objects.create(name="first", checkpoint_uri="/1")
    second = ModelVersion.objects.create(name="second", checkpoint_uri="/2")
    third = ModelVersion.objects.create(name="third", checkpoint_uri="/3")

    with pytest.raises(registry.RegistryError, match="nothing to roll back from"):
        registry.rollback(first, by=engineer, force=True)
    registry.promote(second, by=engineer, force=True, reason="first try")
    with pytest.raises(registry.RegistryError, match="already the annotation model"):
        registry.promote(second, by=engineer, force=True)
    with pytest.raises(registry.RegistryError, match="newer than second and was never active"):
        registry.rollback(third, by=engineer, force=True)
    with pytest.raises(registry.NotServable, match="has no endpoint URL"):
        registry.rollback(first, by=engineer)
    registry.rollback(first, by=engineer, force=True, reason="second was worse")
    registry.promote(third, by=engineer, force=True)
    registry.rollback(second, by=engineer, force=True)  # registered before third
    registry.demote(by=engineer, reason="maintenance")
    assert not ModelVersion.objects.filter(is_active=True).exists()
    with pytest.raises(registry.RegistryError, match="no model is active"):
        registry.demote(by=engineer)

    rows = list(ModelPromotion.objects.order_by("created_at", "id").values_list("action", "from_model", "to_model"))
    assert rows == [
        ("promote", None, second.pk),
        ("rollback", second.pk, first.pk),
        ("promote", first.pk, third.pk),
        ("rollback", third.pk, second.pk),
        ("demote", second.pk, None),
    ]
    first_rollback = ModelPromotion.objects.get(action="rollback", to_model=first)
    assert first_rollback.forced and first_rollback.by == engineer and first_rollback.reason == "second was worse"


def test_register_by_hand_refuses_a_taken_name(make_user):
    engineer = make_user("ml_engineer")
    model = registry.register_by_hand(engineer, name="ui-tars", checkpoint_uri="hf://x", endpoint_url=CLOSED)
    assert model.created_by == engineer and model.serve_command.startswith("vllm serve hf://x")
    with pytest.raises(registry.RegistryError, match="already registered"):
        registry.register_by_hand(engineer, name="ui-tars", checkpoint_uri="hf://y")


def test_concurrent_promotions_keep_exactly_one_active_model(transactional_db):
    """Two engineers promoting at once: the advisory lock orders them, neither fails on the one-active constraint."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    models = [ModelVersion.objects.create(name=f"m{i}", checkpoint_uri=f"/{i}") for i in range(2)]

    def promote_many(model: ModelVersion) -> None:
        try:
            for _ in range(15):
                fresh = ModelVersion.objects.get(pk=model.pk)  # only this thread makes it active
                if not fresh.is_active:
                    registry.promote(fresh, by=None, force=True)
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(promote_many, models))
    assert ModelVersion.objects.filter(is_active=True).count() == 1
    rows = list(ModelPromotion.objects.order_by("id"))  # ids are taken under the lock: its order
    assert len(rows) >= 2 and rows[0].from_model is None
    for before, after in itertools.pairwise(rows):  # an unbroken chain: each starts where the last one ended
        assert after.from_model_id == before.to_model_id


def test_an_evaluation_reuses_the_base_models_result_only_under_the_same_setup():
    """The evaluate stage plays the base model again only when its own evaluation measured something else: other
    held-out tasks, another evaluator, other settings (flywheel.training_stages.evaluation_setup)."""
    from annotation_app.models import Task
    from flywheel.training_stages import _earlier_result, evaluation_setup

    evaluator = {"func": "check_include_exclude", "result": {"type": "vm_command_line", "command": "ls"},
                 "expected": {"type": "rule", "rules": {"include": ["x"]}}}  # fmt: skip
    tasks = [Task.objects.create(external_id=f"held-{n}", instruction=f"Task {n}", domain="os", evaluator=evaluator,
                                 metadata={"split": "heldout"}) for n in range(2)]  # fmt: skip
    greedy = Iteration(config={"evaluate": {"episodes": 2, "temperature": 0.0, "seed": 0}})
    setup = evaluation_setup(greedy, tasks)
    base = ModelVersion.objects.create(name="base-eval", checkpoint_uri="/models/base")
    assert _earlier_result(base, setup) is None  # never evaluated
    base.evaluation = {"new": {"success_rate": 0.5, "setup": setup}, "iteration": 7}
    assert _earlier_result(base, setup) == {"success_rate": 0.5, "setup": setup, "reused_from_iteration": 7}
    assert _earlier_result(None, setup) is None
    sampled = Iteration(config={"evaluate": {"episodes": 2, "temperature": 1.0, "seed": 0}})
    assert _earlier_result(base, evaluation_setup(sampled, tasks)) is None
    assert _earlier_result(base, evaluation_setup(greedy, tasks[:1])) is None
    tasks[1].evaluator = {**evaluator, "expected": {"type": "rule", "rules": {"include": ["y"]}}}
    assert _earlier_result(base, evaluation_setup(greedy, tasks)) is None

    # A base no iteration trained (the untrained agent): the parent side of an earlier iteration on it, never a
    # result that iteration itself reused.
    untrained = ModelVersion.objects.create(name="untrained-eval", checkpoint_uri="/models/untrained")
    played = {"success_rate": 0.0, "setup": setup}

    def evaluated_on(parent: dict) -> Iteration:
        stages = {"evaluate": {"status": "done", "output": {"new": {"setup": setup}, "parent": parent}}}
        return Iteration.objects.create(base_model=untrained, status=Iteration.Status.SUCCEEDED, stages=stages)

    first = evaluated_on(played)
    evaluated_on({**played, "reused_from_iteration": first.pk})
    assert _earlier_result(untrained, setup) == {**played, "reused_from_iteration": first.pk}
    assert _earlier_result(untrained, evaluation_setup(sampled, tasks)) is None


def test_a_new_demonstration_unloads_earlier_ones_models_but_the_active_one(settings, policy_server, models_root):
    """The server keeps what it served across restarts and holds at most --max-models: a demonstration frees the
    earlier demonstrations' models before it loads its own (flywheel.demo.release_earlier_demonstrations)."""
    from flywheel.demo import ROOT_PREFIX, release_earlier_demonstrations

    settings.EMBEDDED_POLICY_URL = policy_server
    for card in httpx.get(f"{policy_server}/models").json()["data"]:  # the module's server: earlier tests' models
        if card["id"] != "base":
            assert registry.unload_from_embedded_server(card["id"]) is None
    checkpoint = str(models_root / "iteration-1" / "sft" / "model")
    root = ModelVersion.objects.create(name=f"{ROOT_PREFIX}-s0-old", checkpoint_uri=checkpoint)
    trained = ModelVersion.objects.create(name="old-demo-sft", checkpoint_uri=checkpoint, parent=root)
    active = ModelVersion.objects.create(name="old-demo-ppo", checkpoint_uri=checkpoint, parent=trained)
    other = ModelVersion.objects.create(name="an-engineers-model", checkpoint_uri=checkpoint)
    for model in (root, trained, active, other):
        assert registry.load_into_embedded_server(model.name, checkpoint) is None
        ModelVersion.objects.filter(pk=model.pk).update(endpoint_url=policy_server, served_name=model.name)
    ModelVersion.objects.filter(pk=active.pk).update(is_active=True)

    release_earlier_demonstrations()
    served = {card["id"] for card in httpx.get(f"{policy_server}/models").json()["data"]}
    assert {"old-demo-ppo", "an-engineers-model"} <= served
    assert not served & {root.name, "old-demo-sft"}
