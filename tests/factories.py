"""factory_boy factories for the domain models."""

import factory

from annotation_app.models import Assignment, Role, Step, Task, Trajectory, User
from flywheel.models import ModelVersion


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User

    username = factory.Sequence(lambda n: f"user{n}")
    role = Role.ANNOTATOR
    password = factory.django.Password("pw")


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    instruction = factory.Sequence(lambda n: f"Do the thing number {n} in the spreadsheet.")
    domain = "libreoffice_calc"
    difficulty = 3


class AssignmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Assignment

    task = factory.SubFactory(TaskFactory, status=Task.Status.ASSIGNED)
    annotator = factory.SubFactory(UserFactory)


class ModelVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelVersion

    name = factory.Sequence(lambda n: f"policy-v{n}")
    checkpoint_uri = factory.LazyAttribute(lambda o: f"/checkpoints/{o.name}")


class TrajectoryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Trajectory

    task = factory.SubFactory(TaskFactory)
    annotator = factory.SubFactory(UserFactory)
    mode = Trajectory.Mode.INTERACTIVE


class StepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Step

    trajectory = factory.SubFactory(TrajectoryFactory)
    index = factory.Sequence(lambda n: n)
    thought = "Click the button."
    action_text = "click(start_box='(10,20)')"
