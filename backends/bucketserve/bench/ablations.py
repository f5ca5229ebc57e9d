"""BucketServe ablations: which component switches the server exposes, as sweep targets.

An ablation turns one BucketServe component off (bucketing, the dynamic batch controller,
online-first priority). It runs only if a switch for it exists: a boolean field of
ServeConfig, or of SchedulerConfig reachable through a ServeConfig dict field
(`scheduler_overrides` or `scheduler`). Nothing is emulated; a missing switch is reported.
"""

from __future__ import annotations

from dataclasses import fields

from bucketserve.bench.sweep import Target

COMPONENTS = {  # ablation label -> component name used to look up a switch
    "bucketserve-no-bucketing": "bucketing",
    "bucketserve-no-batch-controller": "batch_controller",
    "bucketserve-no-priority": "priority",
}
PASSTHROUGH = ("scheduler_overrides", "scheduler")


def _switch_names(component: str) -> tuple[str, ...]:
    return (f"enable_{component}", f"use_{component}", component)


def _bool_fields(cls) -> set[str]:
    return {f.name for f in fields(cls) if f.type in (bool, "bool")}


def find_switch(component: str) -> dict | None:
    """ServeConfig overrides that turn `component` off, or None when no switch exists."""
    from bucketserve.scheduling import SchedulerConfig
    from bucketserve.serving.config import ServeConfig

    serve_bools = _bool_fields(ServeConfig)
    for name in _switch_names(component):
        if name in serve_bools:
            return {name: False}
    serve_fields = {f.name for f in fields(ServeConfig)}
    sched_bools = _bool_fields(SchedulerConfig)
    for via in PASSTHROUGH:
        if via in serve_fields:
            for name in _switch_names(component):
                if name in sched_bools:
                    return {via: {name: False}}
    return None


def ablation_targets() -> tuple[list[Target], list[str]]:
    """Runnable ablation targets and one report line per ablation (run or why not)."""
    targets, notes = [], []
    for label, component in COMPONENTS.items():
        overrides = find_switch(component)
        if overrides is None:
            notes.append(
                f"* `{label}`: **not run** — the server exposes no switch to turn off "
                f"{component.replace('_', ' ')} (looked for a boolean "
                f"{'/'.join(_switch_names(component))} in ServeConfig, or in SchedulerConfig via "
                f"ServeConfig.{'/'.join(PASSTHROUGH)})."
            )
        else:
            targets.append(Target(label, "bucketserve", overrides))
            notes.append(f"* `{label}`: bucketserve with {overrides}.")
    return targets, notes
