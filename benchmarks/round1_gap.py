"""Where the early rounds on Prac MNIST (Dir(0.1), 20 clients) part from the cwFedAvg authors' code.

Runs FedAvg and cwFedAvg (Output, λ 10) for a few rounds on the very files the authors' code
trains on (a folder written by PFLlib's ``generate_MNIST.py noniid - dir``, read with
``data.dataset=pfllib``), and on rayfed's own partition of MNIST, one factor changed at a time:

* ``data``: rayfed's partition of torchvision's MNIST (``mnist``) or the PFLlib files (``pfllib``).
  The two hold the same bytes client by client and in the same order, so with one seed the two
  runs must agree to the last digit: the data, the split and the order of the files are then
  ruled out;
* ``batch``: 10 (the papers' and the arXiv code's batch) or 32 (the default of the ICCV code's
  ``system/main.py``, which its README's command does not override);
* ``init``: the initial model drawn from rayfed's own stream of the seed (``derived``) or right
  after ``torch.manual_seed(seed)`` (``torch_seed``), where the ICCV code's ``main.py`` draws it,
  so that seed s starts from the model the authors' run with ``-seed s`` starts from;
* ``seed``: the model's initialisation and the clients' batch order.

It prints the pooled accuracy (%) at rounds 0..R of every run, then mean ± std over the seeds.

    python benchmarks/round1_gap.py --pfllib-root /tmp/pfllib/MNIST --mnist-root ~/data \\
        --rounds 5 --seeds 0,1,2 --out /tmp/round1-gap \\
        --cases fedavg:pfllib:10:derived,fedavg:pfllib:10:torch_seed

Runs already finished under ``--out`` are read back, not run again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from rayfed.config import RunConfig
from rayfed.config.presets import preset_overrides

_METHODS = {
    "fedavg": {"algorithm.name": "fedavg"},
    "cwfedavg": {
        "algorithm.name": "cwfedavg",
        "algorithm.params.variant": "wdr",
        "algorithm.params.classwise_blocks": 1,
        "algorithm.params.wdr_lambda": 10.0,
    },
}


def _config(
    method: str, data: str, batch: int, init: str, seed: int, rounds: int, args: argparse.Namespace
) -> RunConfig:
    values = {k: v for k, v in preset_overrides("cwfedavg-mnist").items() if not k.startswith("algorithm.")}
    values.update(_METHODS[method])
    if data == "pfllib":
        values.update({"data.dataset": "pfllib", "data.partition": "pfllib", "data.root": args.pfllib_root})
    else:
        values.update({"data.dataset": "mnist", "data.root": args.mnist_root})
    values.update(
        {
            "train.batch_size": batch,
            "train.rounds": rounds,
            "seed": seed,
            "model.init": init,
            "engine.backend": "local",
            "engine.progress": False,
            "engine.eval_train_loss": False,
            "run_dir": str(Path(args.out) / f"{method}-{data}-b{batch}-{init}-s{seed}"),
        }
    )
    return RunConfig().override(values)


def _curve(run_dir: Path) -> list[float]:
    rows = sorted(
        pq.read_table(run_dir / "rounds.parquet", columns=["round", "accuracy"]).to_pylist(), key=lambda r: r["round"]
    )
    return [100 * r["accuracy"] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pfllib-root", required=True, help="the folder PFLlib's generate_MNIST.py wrote")
    parser.add_argument("--mnist-root", required=True, help="data.root of torchvision's MNIST")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--cases",
        default="fedavg:pfllib:10:derived,fedavg:pfllib:10:torch_seed",
        help="method:data:batch:init, comma-separated",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from rayfed.engine import run

    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[list[float]]] = {}
    for case in args.cases.split(","):
        method, data, batch, init = case.split(":")
        for seed in seeds:
            config = _config(method, data, int(batch), init, seed, args.rounds, args)
            run_dir = Path(str(config.run_dir))
            if not (run_dir / "summary.json").is_file():
                run(config)
            curve = _curve(run_dir)
            results.setdefault(case, []).append(curve)
            print(f"{case} seed {seed}: " + " ".join(f"{v:.2f}" for v in curve), flush=True)
    print("\nmean ± std over seeds, rounds 0.." + str(args.rounds))
    for case, curves in results.items():
        values = np.array(curves)
        print(f"{case:32s} " + " ".join(f"{m:6.2f}±{s:4.2f}" for m, s in zip(values.mean(0), values.std(0))))
    (Path(args.out) / "round1_gap.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
