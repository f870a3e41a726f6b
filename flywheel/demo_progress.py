"""The demonstration's progress display: one tqdm bar whose length is the plan's expected work, stage by stage, so
its ETA follows what is left rather than how many stages are left (the grounding drills alone are a tenth of the
stages' count but a tenth of the run's time only at level 2, and an iteration's validate and export take under a
second where its SFT takes three minutes)."""

from __future__ import annotations

from typing import Any, Protocol


class DemoPlan(Protocol):
    """What the progress display reads of `flywheel.demo.DemoPlan` (not imported: demo imports this module)."""

    families: tuple[str, ...]
    iterations: int
    train_per_family: int
    heldout_per_family: int
    bootstrap_per_family: int | None
    demos_per_task: int
    annotate_per_iteration: int
    rft_tasks_per_iteration: int
    rft_attempts: int
    max_steps: int
    drills: int
    train: dict[str, Any]


# Seconds per unit of work on the 2-core reference machine (docs/flywheel.md, the level-2 runs of 2026-11-28 with
# evaluation keeping its sessions). Only their ratios matter: the bar's rate, and so its ETA, is measured as it runs.
DRILL_S = 0.0105  # per grounding drill (32,000 in 309-351 s)
DEMONSTRATION_S = 1.4  # per oracle demonstration (12 in 16.7 s)
SFT_STEP_S = 0.15  # per SFT optimizer step and episode step allowed (200 steps at 6 in 170-189 s)
EVALUATE_STEP_S = 0.22  # per held-out episode step allowed (96 episodes of 6 steps in 113-132 s)
ANNOTATE_STEP_S = 0.75  # per annotated episode step allowed (48 episodes of 6 steps in 165-246 s)
RFT_STEP_S = 0.25  # per RFT attempt step allowed (60 attempts of 6 steps in 86-136 s; less with kept sessions)
PPO_S = 16.0  # one short round (14-19 s)
BOOKKEEPING_S = 0.5  # validate, export: database work, under a second


def stage_costs(plan: DemoPlan, bootstrap: list[str], loop: list[str]) -> dict[str, float]:
    """Expected seconds of each of the plan's stages, keyed "iteration:stage" in the order they run: the drills and
    demonstrations, iteration 0's `bootstrap` stages, then each iteration's annotation and `loop` stages."""
    sft_steps = float(((plan.train.get("sft") or {}).get("max_steps")) or 200)
    heldout = plan.heldout_per_family * len(plan.families)
    bootstrap_demos = (plan.bootstrap_per_family or plan.train_per_family) * len(plan.families) * plan.demos_per_task
    evaluate = heldout * plan.max_steps * EVALUATE_STEP_S
    per_stage = {
        "sft": sft_steps * plan.max_steps * SFT_STEP_S,
        "ppo": PPO_S,
        "evaluate": evaluate,
        "rft": plan.rft_tasks_per_iteration * plan.rft_attempts * plan.max_steps * RFT_STEP_S,
        "annotation": plan.annotate_per_iteration * plan.max_steps * ANNOTATE_STEP_S,
    }
    costs = {"0:drills": plan.drills * DRILL_S} if plan.drills else {}
    costs["0:demonstrations"] = bootstrap_demos * DEMONSTRATION_S
    for stage in bootstrap:
        # iteration 0 evaluates the untrained (or drilled) base as well as its own model, and the base plays most
        # episodes to their step limit: 2.5-3 times a later evaluation (407 s against 111-161 at level 2)
        costs[f"0:{stage}"] = 3 * evaluate if stage == "evaluate" else per_stage.get(stage, BOOKKEEPING_S)
    for number in range(1, plan.iterations + 1):
        for stage in ["annotation", *loop]:
            costs[f"{number}:{stage}"] = per_stage.get(stage, BOOKKEEPING_S)
    return costs


class TerminalProgress:
    """One tqdm bar over the plan's expected work: a stage's share grows with its own done/total (drills, episodes)
    and is full when the next stage starts; the description names the iteration, the stage and its done/total, and
    the percentage and ETA are of the work, at the pace measured so far."""

    def __init__(self, plan: DemoPlan, stream: Any, bootstrap: list[str], loop: list[str]) -> None:
        from tqdm import tqdm

        self.costs = stage_costs(plan, [str(s) for s in bootstrap], [str(s) for s in loop])
        self.starts: dict[str, float] = {}
        position = 0.0
        for unit, cost in self.costs.items():
            self.starts[unit] = position
            position += cost
        self.stages = len(self.costs)
        # smoothing=0: the ETA divides what is left by the mean pace since the start; tqdm's moving average read
        # 1 h 45 min during an evaluation whose episodes count for little of the plan's work
        self.bar = tqdm(total=round(position, 1), file=stream, dynamic_ncols=True, mininterval=0.5, smoothing=0,
                        bar_format="{desc}{percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")  # fmt: skip

    def position(self, unit: str, done: int | None, total: int | None) -> float | None:
        """Where the bar stands when `unit` has done `done` of `total` (None: a unit the plan does not have)."""
        start = self.starts.get(unit)
        if start is None:
            return None
        fraction = min(max(done / total, 0.0), 1.0) if done is not None and total else 0.0
        return start + self.costs[unit] * fraction

    def __call__(self, stage: str, iteration: int, done: int | None, total: int | None) -> None:
        unit = f"{iteration}:{stage}"
        at = self.bar.total if stage == "report" else self.position(unit, done, total)
        if at is not None and at > self.bar.n:
            self.bar.update(round(at - self.bar.n, 1))
        number = list(self.costs).index(unit) + 1 if unit in self.costs else self.stages
        count = f" {done}/{total}" if total else ""
        self.bar.set_description(f"stage {number}/{self.stages} · iteration {iteration} · {stage}{count}",
                                 refresh=False)  # fmt: skip
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
