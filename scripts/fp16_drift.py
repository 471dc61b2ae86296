#!/usr/bin/python3
"""How far can an FP16 run's test accuracy drift from an FP32 run of the same start?

The GPU test TrainGpu.Fp16WithinAPointOfFp32 (test/train/test_train_gpu.cpp) trains one
epoch on the first 12,000 MNIST images twice from the same weights, in FP32 and with
--fp16, and asks that the two test accuracies be close. This script measures, on the CPU,
how close two such runs can be expected to land, so the test's margin rests on numbers.

For each seed it trains the model twice from microflow's initial weights and batch order
(the generator, Glorot draws and shuffles of scripts/compare_with_pytorch.py), with
Keras's Adam on f32 master weights:
  * fp32: plain float32;
  * fp16 (emulated): the input, every weight, every activation and the logits are rounded
    to float16 where microflow's --fp16 stores them in f16; every gradient that flows
    back through those roundings is rounded to float16 after multiplying by a dynamic
    loss scale (2^16 at the start, halved and the step skipped when a gradient
    overflows), then divided by it again.
It is an emulation (float32 arithmetic between the roundings, PyTorch's summation
order), not the GPU path itself: it shows how much f16 rounding alone moves the result.

Usage (Debian's python3-torch, CPU; about four minutes per seed on two cores):
  scripts/fp16_drift.py --data .cache/mnist --seeds 0-19
"""
import argparse
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:  # the usage needs no PyTorch
        print(__doc__)
        sys.exit(0)
    sys.exit(f"fp16_drift: error: PyTorch or NumPy is not installed for {sys.executable} (apt-get install python3-torch)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_with_pytorch as ref  # noqa: E402  (the generator, Glorot draws, shuffles, Adam)
from accuracy_over_seeds import seed_list  # noqa: E402  ("0-19,37" -> seeds)


class LossScale:
    def __init__(self):
        self.scale = 65536.0


def rounding(scale):
    """f16 rounding of a value; its gradient rounded to f16 at the current loss scale."""

    class Round(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.half().float()

        @staticmethod
        def backward(ctx, g):
            return (g * scale.scale).half().float() / scale.scale

    return Round.apply


def train(seed, x_train, y_train, x_test, y_test, half):
    params = ref.initial_params(seed)
    scale = LossScale()
    q = rounding(scale) if half else (lambda t: t)

    def model(x):
        x = q(x)
        w = [q(p) for p in params]
        x = q(F.max_pool2d(q(F.relu(F.conv2d(x, w[0], w[1]))), 2))
        x = q(F.max_pool2d(q(F.relu(F.conv2d(x, w[2], w[3]))), 2))
        x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flatten as NHWC, like Keras
        x = q(F.relu(F.linear(x, w[4], w[5])))
        return q(F.linear(x, w[6], w[7]))

    state, skipped, n = {"t": 0}, 0, x_train.shape[0]
    perm = torch.from_numpy(ref.epoch_permutation(n, seed, 0))
    for b0 in range(0, n, 64):
        idx = perm[b0:b0 + 64]
        F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        if not all(torch.isfinite(p.grad).all() for p in params):
            scale.scale /= 2  # an f16 gradient overflowed: skip the step, halve the scale
            skipped += 1
            for p in params:
                p.grad = None
            continue
        ref.keras_adam(params, state)
    with torch.no_grad():
        correct = sum((model(x_test[i:i + 1000]).argmax(1) == y_test[i:i + 1000]).sum().item()
                      for i in range(0, x_test.shape[0], 1000))
    return correct / x_test.shape[0], skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seeds", type=seed_list, default="0-9", help="e.g. 0-19 or 37,0-5")
    ap.add_argument("--limit-train", type=int, default=12000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # PyTorch's own convolutions, not oneDNN's, whose AVX2 backward pass (the one taken on a
    # CPU without AVX-512) has gradient errors far above rounding: see compare_with_pytorch.py.
    torch.backends.mkldnn.enabled = False

    def to_x(a):
        return torch.from_numpy(a.astype(np.float32) / np.float32(255.0)).unsqueeze(1)

    xtr = ref.read_idx(args.data, ["train-images-idx3-ubyte", "train-images.idx3-ubyte"])
    ytr = ref.read_idx(args.data, ["train-labels-idx1-ubyte", "train-labels.idx1-ubyte"])
    xte = ref.read_idx(args.data, ["t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"])
    yte = ref.read_idx(args.data, ["t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"])
    n = min(args.limit_train, 48000)
    x_train, y_train = to_x(xtr[:n]), torch.from_numpy(ytr[:n].astype(np.int64))
    x_test, y_test = to_x(xte), torch.from_numpy(yte.astype(np.int64))

    print(f"1 epoch on the first {n} training images, batch 64; test accuracy on {x_test.shape[0]} images")
    print(f"{'seed':>4}  {'fp32':>7}  {'fp16':>7}  {'fp16 - fp32':>11}  skipped")
    diffs = []
    for seed in args.seeds:
        a32, _ = train(seed, x_train, y_train, x_test, y_test, False)
        a16, skipped = train(seed, x_train, y_train, x_test, y_test, True)
        diffs.append(100 * (a16 - a32))
        print(f"{seed:>4}  {a32:>7.4f}  {a16:>7.4f}  {diffs[-1]:>+8.2f} pt  {skipped:>7}", flush=True)
    d = np.array(diffs)
    print(f"{len(d)} seeds: fp16 - fp32 mean {d.mean():+.2f}, sd {d.std(ddof=1) if len(d) > 1 else 0:.2f}, "
          f"largest |difference| {np.abs(d).max():.2f} points")


if __name__ == "__main__":
    main()
