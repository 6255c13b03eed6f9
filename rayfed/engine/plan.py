"""Everything a run is checked against before anything is written, decided once: :func:`plan_run`.

A run that cannot be carried out is refused here, with every file of its directory as it was
(README.md, "Faults and bad input"):

* its run directory: can it be made, is it rayfed's to write in and free, may this run start or
  continue in it (:mod:`rayfed.provenance.run_dir`), does a continued run's directory hold what its run sealed (the
  marker's seal, ``config.json``, the files of its code and its trace files: :mod:`rayfed.provenance.run_seal`,
  :mod:`rayfed.provenance.plugin_seal`, :mod:`rayfed.provenance.trace_seal`), and where does it resume
  (:mod:`rayfed.provenance.resume_point`, which reads every file a resume needs and proves its checkpoint is this
  run's: :mod:`rayfed.provenance.run_identity`);
* its resources: workers, memory and client states (:func:`rayfed.engine.sizing.check_fits`);
* its inputs: the dataset, the problem (the algorithm checks its params against it), the held-out
  server data and the partition (:class:`~rayfed.engine.inputs.RunInputs`);
* whether any client can take a local step (:func:`rayfed.engine.trainability.check_trainable`);
* the packages of the experiment trackers ``engine.loggers`` names (:func:`rayfed.config.check_installed`);
* its system model: the clients' devices, and the rounds the loop asks for (:mod:`rayfed.scheduling.system_setup`),
  with ``system.step_s`` measured where the run calibrates it (:mod:`rayfed.scheduling.calibration`).

It also says, once, what of the fast path the run cannot take (:mod:`rayfed.engine.fast_path`).

The :class:`RunPlan` carries what those checks found, so the round loop reads each fact once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rayfed.algorithms import ResolvedAlgorithm, resolve
from rayfed.config import RunConfig, check_installed
from rayfed.engine.fast_path import log_slow_paths
from rayfed.engine.inputs import RunInputs
from rayfed.engine.privacy_records import check_privacy
from rayfed.engine.sizing import MemoryEstimate, check_fits
from rayfed.engine.trainability import check_trainable
from rayfed.provenance.plugin_seal import marker_note, marker_sources
from rayfed.provenance.resume_point import ResumePoint, read_resume_point
from rayfed.provenance.run_dir import check_creatable, check_run_dir
from rayfed.provenance.run_identity import RunMarker, run_identity
from rayfed.provenance.run_seal import check_config_file
from rayfed.provenance.trace_seal import check_traces, trace_records
from rayfed.scheduling.calibration import with_measured_step_s, with_recorded_step_s
from rayfed.scheduling.sync_rounds import Rounds
from rayfed.scheduling.system_setup import plan_rounds
from rayfed.util.plugin_check import check_sources
from rayfed.util.plugins import plugin_sources, run_sources
from rayfed.util.progress import progress_shown

__all__ = ["RunPlan", "plan_run", "default_run_dir"]


@dataclass(frozen=True)
class RunPlan:
    """A run that passed every check: where it writes, what it continues from, what it trains on."""

    config: RunConfig
    algorithm: ResolvedAlgorithm
    run_dir: Path
    continues: bool
    """Whether the run directory holds this run already (resumed, or started again: no round saved)."""
    identity: str
    """The run's identity (:func:`~rayfed.provenance.run_identity.run_identity`), which its checkpoints record."""
    resume: ResumePoint
    """The run marker to write, and the checkpoint and rounds it continues from (none for a new run)."""
    memory: MemoryEstimate
    inputs: RunInputs
    rounds: Rounds
    """Whom each round trains and what its system model records (:mod:`rayfed.scheduling.sync_rounds`)."""


def default_run_dir(config: RunConfig) -> Path:
    """``runs/<algorithm>-<dataset>-s<seed>-<time>``: a new directory for a run that names none."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(f"runs/{config.algorithm.name}-{config.data.dataset}-s{config.seed}-{stamp}")


def plan_run(config: RunConfig, *, resume: bool = False) -> RunPlan:
    """Check ``config``'s run in the order that writes nothing and fails cheapest first; raises a
    :class:`~rayfed.util.errors.RayfedError` naming the field or file and its fix. The config the run records
    lists the files of its code outside rayfed (:func:`rayfed.util.plugins.plugin_sources`), and its marker their
    digests, sealed."""
    sources = run_sources(config)
    entries = tuple(dict.fromkeys([*config.plugins, *plugin_sources(config)]))
    config = replace(config, plugins=entries) if entries != config.plugins else config
    algorithm = resolve(config.algorithm)
    check_privacy(config, algorithm)
    check_installed(config.engine.loggers)
    run_dir = Path(config.run_dir) if config.run_dir else default_run_dir(config)
    check_creatable(run_dir)
    config = with_recorded_step_s(config, run_dir)
    continues = check_run_dir(run_dir, config, resume=resume)
    recorded, accepted, traces = RunMarker.read(run_dir) if continues else None, [], trace_records(config)
    if recorded is not None:  # what the directory holds is what its run sealed, before anything runs
        if recorded.config is not None:
            check_config_file(run_dir, recorded.config)
        accepted = check_sources(
            f"run_dir={str(run_dir)!r}", marker_sources(run_dir, recorded), sources, note=marker_note(recorded)
        )
        accepted += check_traces(f"run_dir={str(run_dir)!r}", recorded.traces, traces)
    memory = check_fits(config, run_dir)
    with progress_shown(config.engine.progress):
        inputs = RunInputs.prepare(config, algorithm, run_dir, continues=continues)
    if not continues:
        config = with_measured_step_s(config, algorithm, inputs)
    identity = run_identity(config, inputs.partition)
    if recorded is not None:
        point = read_resume_point(run_dir, config, identity, algorithm.may_hold_nan, recorded)
    else:
        point = ResumePoint(RunMarker.new(identity, config.train.rounds))
    records = [source.record() for source in sources]
    point = replace(point, marker=point.marker.recording(config.to_dict(), records, accepted, traces))
    check_trainable(inputs.partition.num_train(), config.train)
    log_slow_paths(config, algorithm, inputs.dataset)
    rounds = plan_rounds(config, algorithm, inputs)
    return RunPlan(config, algorithm, run_dir, continues, identity, point, memory, inputs, rounds)
