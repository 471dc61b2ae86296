#!/usr/bin/python3
"""How much does the seed move the recipe's test accuracy, in microflow and in PyTorch?

Trains the article's recipe (5 epochs unless --epochs says otherwise, batch 64, Adam,
validation_split 0.2) once per seed with build/bin/train_mnist on the CPU and, with
--pytorch, once per seed with the PyTorch anchor (../shared/anchors/torch_mnist_cpu.py,
Debian's python3-torch), then writes one CSV row per seed and prints, for each framework,
the mean, standard deviation, range and how many seeds reach --bar (99.0 %).

The two frameworks draw their initial weights and batch orders from different random
generators, so seed S in one is not seed S in the other: compare the distributions, not
the rows. (scripts/compare_with_pytorch.py trains both from the same start.)

Usage (about 15 s per microflow seed and 1-2 minutes per PyTorch seed on two cores):
  scripts/accuracy_over_seeds.py --data .cache/mnist --seeds 0-63 --csv out.csv
  scripts/accuracy_over_seeds.py --data .cache/mnist --seeds 0-35 --pytorch --no-microflow
  scripts/accuracy_over_seeds.py --data .cache/mnist --seeds 0-63 --epochs 1 --bar 0.98
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR = os.path.join(ROOT, "..", "shared", "anchors", "torch_mnist_cpu.py")
# Stable PyTorch timings need these (see the anchor's docstring); they do not change results.
TORCH_ENV = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"}


def seed_list(text):
    """ "0-19,37" -> [0, 1, ..., 19, 37]; argparse's type for --seeds (fp16_drift.py uses it too)."""
    seeds = []
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        hi = hi if dash else lo  # "3-" is half a range, not seed 3
        if not lo.isdigit() or not hi.isdigit() or int(hi) < int(lo):
            raise argparse.ArgumentTypeError(f"expected seeds such as 0-63 or 0-3,10, got {text!r}")
        seeds.extend(range(int(lo), int(hi) + 1))
    return seeds


def common_flags(data, seed, epochs, threads):
    """The flags both programs take alike; --threads only when given (else each its own default)."""
    flags = ["--data", data, "--seed", str(seed), "--epochs", str(epochs)]
    return flags + (["--threads", str(threads)] if threads else [])


def microflow(train_mnist, data, seed, epochs, threads):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "metrics.json")
        cmd = [train_mnist, "--device", "cpu", "--quiet", "--metrics-json", path]
        subprocess.run(cmd + common_flags(data, seed, epochs, threads), check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            metrics = json.load(f)
    return metrics["test_accuracy"], metrics["epochs"][0]["val_accuracy"]


def pytorch(anchor, data, seed, epochs, threads):
    out = subprocess.run([sys.executable, anchor] + common_flags(data, seed, epochs, threads),
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, **TORCH_ENV)).stdout
    test = re.search(r"^test_acc ([0-9.]+)", out, re.M)
    val = re.search(r"^epoch 1: .* val_acc ([0-9.]+)", out, re.M)
    if not test or not val:
        raise RuntimeError(f"seed {seed}: no accuracy in the anchor's output:\n{out}")
    return float(test.group(1)), float(val.group(1))


def summary(name, values, bar):
    if not values:
        return
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    reach = sum(v >= bar for v in values)
    print(f"{name:10s} {len(values):3d} seeds  mean {100 * statistics.mean(values):.2f} %  "
          f"sd {100 * sd:.2f}  range {100 * min(values):.2f}-{100 * max(values):.2f} %  "
          f"reaching {100 * bar:.1f} %: {reach} of {len(values)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with the four MNIST IDX files")
    ap.add_argument("--seeds", type=seed_list, default="0-15", help="e.g. 0-63 or 0-3,10")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--bar", type=float, default=0.99, help="count the seeds at or above this accuracy")
    ap.add_argument("--csv", help="write seed, test and first-epoch validation accuracies here")
    ap.add_argument("--train-mnist", default=os.path.join(ROOT, "build", "bin", "train_mnist"))
    ap.add_argument("--threads", type=int, default=0, help="both frameworks (default: theirs)")
    ap.add_argument("--pytorch", action="store_true", help="also run the PyTorch anchor")
    ap.add_argument("--anchor", default=ANCHOR)
    ap.add_argument("--no-microflow", action="store_true", help="only the PyTorch anchor")
    args = ap.parse_args()

    runs = [] if args.no_microflow else [("microflow", lambda s: microflow(args.train_mnist, args.data, s, args.epochs, args.threads))]
    if args.pytorch:
        runs.append(("pytorch", lambda s: pytorch(args.anchor, args.data, s, args.epochs, args.threads)))
    if not runs:
        ap.error("nothing to run: --no-microflow without --pytorch")
    # What would stop the study after its hours of training is looked at before it starts.
    if not args.no_microflow and not os.access(args.train_mnist, os.X_OK):
        sys.exit(f"accuracy_over_seeds: error: {args.train_mnist} is not an executable train_mnist "
                 "(build it first, or give --train-mnist)")
    if args.pytorch and not os.path.isfile(args.anchor):
        sys.exit(f"accuracy_over_seeds: error: the PyTorch anchor {args.anchor} is missing (give --anchor)")
    if args.csv:
        folder = os.path.dirname(os.path.abspath(args.csv))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(args.csv):
            sys.exit(f"accuracy_over_seeds: error: --csv {args.csv}: cannot write there "
                     f"({'a folder' if os.path.isdir(args.csv) else 'no writable folder ' + folder})")

    header = ["seed"] + [f"{name}_{col}" for name, _ in runs for col in (f"test_{args.epochs}ep", "val_ep1")]
    rows, results = [], {name: [] for name, _ in runs}
    for seed in args.seeds:
        row = [seed]
        for name, run in runs:
            try:
                test, val = run(seed)
            except subprocess.CalledProcessError as e:  # its own error is on stderr (or below)
                said = (e.stderr or "").strip().splitlines()
                sys.exit(f"accuracy_over_seeds: error: {name} failed for seed {seed} (exit status {e.returncode})"
                         + (f": {said[-1]}" if said else ""))
            results[name].append(test)
            row += [f"{test:.4f}", f"{val:.4f}"]
        print(" ".join(str(x) for x in row), flush=True)
        rows.append(row)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header] + rows)
    for name, values in results.items():
        summary(name, values, args.bar)


if __name__ == "__main__":
    main()
