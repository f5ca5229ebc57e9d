"""Render the model_repository templates into a run folder for one ServeConfig."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from string import Template

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import (
    INPUT_NAMES,
    OUTPUT_NAMES,
    input_declarations,
    output_declarations,
)

TEMPLATE_ENV = "BUCKETSERVE_MODEL_REPOSITORY"


def template_dir() -> Path:
    """The model_repository templates: $BUCKETSERVE_MODEL_REPOSITORY or the source checkout's."""
    if os.environ.get(TEMPLATE_ENV):
        return Path(os.environ[TEMPLATE_ENV])
    here = Path(__file__).resolve().parents[3] / "model_repository"
    if not here.is_dir():
        raise RuntimeError(f"model_repository templates not found at {here}; set {TEMPLATE_ENV}")
    return here


def instance_groups(devices: list[str]) -> str:
    """One instance group per device, so instance name <model>_<g>_0 gives its device index g."""
    groups = []
    for dev in devices:
        if dev == "cpu":
            groups.append("  { count: 1 kind: KIND_CPU }")
        else:
            groups.append(f"  {{ count: 1 kind: KIND_GPU gpus: [ {int(dev.split(':')[1])} ] }}")
    return ",\n".join(groups)


def template_vars(cfg: ServeConfig, templates: Path, run_config: Path) -> dict[str, str]:
    # One table in serving/contract.py declares the user inputs and outputs of every model.
    input_map = "\n".join(f'      input_map {{ key: "{n}" value: "{n}" }}' for n in INPUT_NAMES)
    output_map = "\n".join(f'      output_map {{ key: "{n}" value: "{n}" }}' for n in OUTPUT_NAMES)
    return {
        "user_inputs": input_declarations(),
        "user_outputs": output_declarations(),
        "decode_output_map": output_map,
        "preprocessing_input_map": input_map,
        "preprocessing_instances": str(cfg.preprocessing_instances),
        "prefill_instances": instance_groups(cfg.prefill_devices),
        "decode_instances": instance_groups(cfg.decode_devices),
        "run_config": str(run_config),
    }


def render(cfg: ServeConfig, run_dir: Path) -> Path:
    """Copy every model folder, substitute ${vars} in its config.pbtxt; returns the repository path."""
    templates = template_dir()
    repo = run_dir / "model_repository"
    if repo.exists():
        shutil.rmtree(repo)
    run_config = run_dir / "run_config.json"
    cfg.write(run_config)
    values = template_vars(cfg, templates, run_config)
    for model in sorted(
        p for p in templates.iterdir() if p.is_dir() and not p.name.startswith("_")
    ):
        shutil.copytree(model, repo / model.name, ignore=shutil.ignore_patterns("__pycache__"))
        config = repo / model.name / "config.pbtxt"
        config.write_text(Template(config.read_text()).substitute(values))
    return repo
