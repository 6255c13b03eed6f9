"""TensorBoard: the run's event files in ``<run_dir>/tensorboard``, written by ``torch.utils.tensorboard``.

Point TensorBoard at a run directory, or at a folder of them (a study's: each trial is a run there, and the
HParams tab compares them): ``tensorboard --logdir runs/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from rayfed.engine.callbacks import RunView
from rayfed.tracking.state import Logged
from rayfed.tracking.study_link import StudyLink
from rayfed.tracking.tracker import RoundPoint, Tracker

__all__ = ["TensorBoardTracker", "LOG_DIR"]

LOG_DIR = "tensorboard"
"""The event files' folder in the run directory."""
_HPARAM_METRICS = ("accuracy", "global_accuracy", "train_loss", "test_loss")
"""The metrics the HParams tab shows beside each run's hyper-parameters."""


class TensorBoardTracker(Tracker):
    """Scalars per metric, histograms per client column, the config as hparams and as text, figures as images.
    A resumed run writes a new event file in the same folder, which TensorBoard reads as the same run."""

    name = "tensorboard"
    folder = LOG_DIR

    def __init__(self, run: RunView, saved: Logged, study: StudyLink | None) -> None:
        self.writer = SummaryWriter(log_dir=str(run.run_dir / LOG_DIR))

    @classmethod
    def recorded(cls, run: RunView, study: StudyLink | None) -> Logged | None:
        """The last step of any scalar in the run's event files, and whether they hold the HParams config."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        if not (run.run_dir / LOG_DIR).is_dir():
            return None
        events = EventAccumulator(str(run.run_dir / LOG_DIR), size_guidance={"scalars": 0})
        events.Reload()
        steps = [event.step for tag in events.Tags()["scalars"] for event in events.Scalars(tag)]
        try:
            config = bool(events.PluginTagToContent("hparams"))
        except KeyError:  # no summary of that plugin was written
            config = False
        return Logged({}, max(steps, default=-1), config) if steps or config else None

    def ids(self) -> dict[str, str]:
        return {}

    def log_config(self, flat: Mapping[str, Any], nested: Mapping[str, Any]) -> None:
        values = {
            path: value if isinstance(value, (bool, int, float, str)) else str(value) for path, value in flat.items()
        }
        events = self.writer.file_writer
        assert events is not None  # opened by SummaryWriter's constructor
        for summary in hparams(values, dict.fromkeys(_HPARAM_METRICS, 0.0)):
            events.add_summary(summary)
        lines = "\n".join(f"    {path} = {value!r}" for path, value in flat.items())
        self.writer.add_text("config", lines)

    def log_rounds(self, points: Sequence[RoundPoint]) -> None:
        for step, metrics, distributions in points:
            for tag, value in metrics.items():
                self.writer.add_scalar(tag, value, step)
            for tag, values in distributions.items():
                self.writer.add_histogram(tag, values, step)

    def confirm(self, step: int | None) -> None:
        """The events handed so far written to the event file (``flush`` waits for the writer's thread, and
        raises the error it met)."""
        self.writer.flush()

    def log_figures(self, step: int, figures: Sequence[Path]) -> None:
        from matplotlib.image import imread

        for path in figures:
            self.writer.add_image(f"figures/{path.stem}", imread(path)[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self, finished: bool) -> None:
        self.writer.close()
