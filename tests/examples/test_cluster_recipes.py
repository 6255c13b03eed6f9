"""The cluster recipes of ``examples/cluster`` (docs/cluster.md, section 3): the cluster-launcher YAML validates
against the schema Ray ships with its autoscaler, the KubeRay ``RayJob`` against the fields of KubeRay's RayJob v1
CRD (``rayjob_v1_schema.json`` beside this file: the CRD's spec, cluster, head and worker-group fields and their
types), and the command each runs is one ``examples/cwfedavg_1000clients.py`` accepts, with a valid config."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from tests.examples.test_examples import _example

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "cluster"
RAYJOB_SCHEMA = Path(__file__).with_name("rayjob_v1_schema.json")


def _recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / name).read_text())


def _example_config(command: str):
    """The RunConfig that ``python examples/cwfedavg_1000clients.py ARGS`` would run."""
    words = shlex.split(command)
    assert words[:2] == ["python", "examples/cwfedavg_1000clients.py"], words
    example = _example("cwfedavg_1000clients")
    return example.build_config(example.arguments().parse_args(words[2:]))


def test_launcher_yaml_validates_against_rays_autoscaler_schema() -> None:
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = _recipe("aws-gpu-spot.yaml")
    jsonschema.validate(config, schema)
    spot = config["available_node_types"]["gpu_spot"]
    assert spot["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert spot["min_workers"] < spot["max_workers"] <= config["max_workers"]
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"]["CPU"] == 0  # no ClientWorker on the head


def test_launcher_yaml_schema_check_catches_a_misspelt_field() -> None:
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = _recipe("aws-gpu-spot.yaml")
    config["available_node_types"]["gpu_spot"]["max_worker"] = config["available_node_types"]["gpu_spot"].pop(
        "max_workers"
    )
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        jsonschema.validate(config, schema)


def _rsync_options(config: dict) -> list[str]:
    """The options ``ray up`` gives rsync for the file mounts, built as Ray's command runner builds them
    (``ray/autoscaler/_private/command_runner.py``, ``_create_rsync_filter_args``)."""
    excludes = [arg for pattern in config.get("rsync_exclude") or [] for arg in ("--exclude", pattern)]
    return excludes + [f"--filter=dir-merge,- {name}" for name in config.get("rsync_filter") or []]


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync, as ray up does")
def test_launcher_copies_the_source_and_not_the_venv_runs_data_or_git(tmp_path: Path) -> None:
    """A working clone as ``ray up`` finds it, copied with the recipe's rsync options: the code travels; the
    local .venv (gigabytes, its scripts' shebangs naming this machine's paths), run directories, data and .git
    do not."""
    clone, node = tmp_path / "clone", tmp_path / "node"
    files = {
        "rayfed/__init__.py": "",
        "examples/cwfedavg_1000clients.py": "",
        "pyproject.toml": "",
        ".venv/bin/ray": "#!/home/me/clone/.venv/bin/python\n",
        ".venv/lib/python3.11/site-packages/torch/__init__.py": "",
        "runs/demo/rounds.parquet": "",
        "data/MNIST/raw/train-images-idx3-ubyte.gz": "",
        ".git/HEAD": "ref: refs/heads/main\n",
        "rayfed/__pycache__/cli.cpython-311.pyc": "",
        "rayfed.egg-info/PKG-INFO": "",
    }
    for name, text in files.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(text)
    shutil.copy(RECIPES.parents[1] / ".gitignore", clone / ".gitignore")
    options = _rsync_options(_recipe("aws-gpu-spot.yaml"))
    subprocess.run(["rsync", "-a", *options, f"{clone}/", f"{node}/"], check=True, capture_output=True)
    copied = sorted(str(p.relative_to(node)) for p in node.rglob("*") if p.is_file())
    assert copied == [".gitignore", "examples/cwfedavg_1000clients.py", "pyproject.toml", "rayfed/__init__.py"]


def test_rayjob_head_dashboard_listens_where_kuberay_submits_the_job() -> None:
    """KubeRay's operator submits the job to the dashboard through the head Service, so the dashboard must listen
    on the pod's addresses (KubeRay's default, 0.0.0.0), not on its loopback."""
    head = _recipe("rayjob.yaml")["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"].get("dashboard-host", "0.0.0.0") == "0.0.0.0"


def test_rayjob_manifest_has_only_fields_of_the_rayjob_v1_spec() -> None:
    schema = json.loads(RAYJOB_SCHEMA.read_text())
    manifest = _recipe("rayjob.yaml")
    jsonschema.validate(manifest, schema)
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayJob")
    cluster = manifest["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    group = cluster["workerGroupSpecs"][0]
    assert group["minReplicas"] < group["maxReplicas"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    # A field the spec does not have (a typo) is refused, as the API server would drop it silently.
    manifest["spec"]["shutdownAfterJobFinish"] = manifest["spec"].pop("shutdownAfterJobFinishes")
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.validate(manifest, schema)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(_recipe("rayjob.yaml")["spec"]["entrypoint"], id="rayjob"),
        pytest.param(
            " ".join(
                line.lstrip("#").strip().rstrip("\\")
                for line in (RECIPES / "aws-gpu-spot.yaml").read_text().splitlines()
                if line.startswith("#       ")
            ),
            id="launcher",
        ),
    ],
)
def test_recipes_run_the_example_with_a_valid_elastic_config(command: str) -> None:
    config = _example_config(command)
    engine = config.engine
    assert engine.num_workers == 0 and engine.max_workers > 0  # the pool follows the nodes, up to a bound
    assert engine.resource_wait_s > 0 and engine.round_timeout_s is not None  # spot nodes: wait, never hang
    assert engine.num_gpus_per_worker > 0 and str(config.run_dir).startswith(("/runs/", "/home/ubuntu/rayfed-runs/"))
