"""Render the model_repository templates into a run folder for one ServeConfig.

The `prefill` and `decode` templates become one Triton model per device (`prefill_0`,
`decode_1`, ...), so the scheduler can call the instance it chose by name. With more than one
decode device the ensemble's decode step is `decode_router`, which relays from the `decode_<i>`
named in each hand-off; with one, the ensemble calls `decode_0` directly (no extra hop)."""

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
    here = Path(__file__).resolve().parents[4] / "model_repository"
    if not here.is_dir():
        raise RuntimeError(f"model_repository templates not found at {here}; set {TEMPLATE_ENV}")
    return here


PER_DEVICE = ("prefill", "decode")  # templates rendered once per device, as <name>_<index>


def instance_group(device: str) -> str:
    """The one instance group of a per-device model."""
    if device == "cpu":
        return "  { count: 1 kind: KIND_CPU }"
    return f"  {{ count: 1 kind: KIND_GPU gpus: [ {int(device.split(':')[1])} ] }}"


def model_index(model_name: str) -> int:
    """Device index of a per-device model: "decode_1" -> 1."""
    return int(model_name.rsplit("_", 1)[1])


def decode_step_model(cfg: ServeConfig) -> str:
    """What the ensemble's decode step calls."""
    return "decode_0" if len(cfg.decode_devices) == 1 else "decode_router"


def copies(template: str, cfg: ServeConfig) -> list[tuple[str, dict[str, str]]]:
    """(model name, extra template vars) for each model rendered from one template folder."""
    if template in PER_DEVICE:
        devices = cfg.engine_prefill_devices if template == "prefill" else cfg.decode_devices
        return [
            (f"{template}_{i}", {"model_name": f"{template}_{i}", "instances": instance_group(d)})
            for i, d in enumerate(devices)
        ]
    if template == "decode_router" and len(cfg.decode_devices) == 1:
        return []
    return [(template, {})]


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
        "decode_model": decode_step_model(cfg),
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
        for name, extra in copies(model.name, cfg):
            shutil.copytree(model, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
            config = repo / name / "config.pbtxt"
            config.write_text(Template(config.read_text()).substitute(values | extra))
    return repo
