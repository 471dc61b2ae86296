#!/usr/bin/env python3
"""fused_model.py: the performance model of the fused GPU step (docs/fused_step.md): for each
of its kernels the bytes it moves, the FLOPs it does and its graph nodes, and its predicted
time on the H200 from the card's ceilings, summed to a predicted epoch at batch 64 and 1024.

    python3 scripts/fused_model.py [--markdown]

Every number it prints is a PREDICTION from the constants below, not a measurement. The GPU
run (scripts/device_check.sh) puts the measured time per kernel beside it.

A kernel's time is max(latency floor, bytes / bandwidth, FLOPs / rate) plus the cost of its
graph node, and a replay costs REPLAY_US, shared by the STEPS_PER_REPLAY steps it runs. The
kernels are those train/fused_step.cu launches (FP32: 8 a step, Adam's step count moved by
kernel 7; FP16: 10, the loss scaler's check added and the count moved after it); conv2's weight gradient (5) rides in its data gradient's launch (4), so it adds
its time but no floor and no graph node.
"""
import sys

# ---- the H200's ceilings (the ones named in the fused-step issue) and our assumptions ----
BANDWIDTH = 4.3e12          # bytes/s: device-to-device copies, measured
FP32_RATE = 51e12           # FLOP/s: FP32 FMA on CUDA cores, measured
TF32_RATE = 495e12          # FLOP/s: dense TF32 on Tensor Cores (NVIDIA's figure, not measured)
FP16_RATE = 990e12          # FLOP/s: dense FP16 on Tensor Cores (NVIDIA's figure, not measured)
EFFICIENCY = 0.5            # ASSUMED: tuned kernels reach half of a rate (CUDA cores), or
TC_EFFICIENCY = 0.3         # ASSUMED: 30 % of a Tensor Core rate (mma.sync, no wgmma)
PLAIN_EFFICIENCY = 0.15     # ASSUMED: the plain kernels (one thread per output, no tiles)
GATHER_EFFICIENCY = 0.05    # ASSUMED: conv2's data gradient as written does only the nonzero taps
                            # (NONZERO of the work), ~20 instructions each (finding them, their
                            # weights' addresses): 5 % of the FP32 rate for those FLOPs
TAPS_EFFICIENCY = 0.25      # ASSUMED: conv2's weight gradient as written: the nonzero taps only too,
                            # nine FMAs for each gradient and winner read (~4 instructions a FMA)
WMMA_EFFICIENCY = 0.1       # ASSUMED: conv2's forward as written on Tensor Cores (fused_conv_tc.cu):
                            # wmma fed from a per-warp stage in shared memory, one stage in flight,
                            # the weights' fragments from L1/L2: a tenth of the dense rate
NODE_US = 1.1               # graph node, measured
REPLAY_US = 9.0             # one graph replay, measured
FLOOR_US = 2.5              # ASSUMED: the shortest a kernel of this step takes (launch to finish)
STEPS_PER_REPLAY = 16       # kFusedStepsPerGraph in train/gpu_steps.cu
NONZERO = 0.15              # conv2's output gradient that is nonzero (CPU --verbose: 12-15 %)
EPOCH_IMAGES = 48000

# ---- the model, per image ----
X = 28 * 28                 # input pixels (u8 in the resident data set)
P1 = 13 * 13 * 32           # conv1 after pooling
P2 = 5 * 5 * 64             # conv2 after pooling
MAC = {"conv1": 26 * 26 * 32 * 9, "conv2": 11 * 11 * 64 * 288, "dense": 1600 * 64, "dense_1": 64 * 10}
PARAMS = 320 + 18496 + 102464 + 650


def kernels(batch, act_bytes, conv2_rate, sparse, forward_rate=None, dgrad_rate=None, wgrad_rate=None,
            conv2_forward_rate=None):
    """(name, bytes, FLOPs, rate) of each kernel of one step. act_bytes: 4 (FP32) or 2 (FP16);
    conv2_rate: the convolutions' rate, forward_rate the forward kernels' (1, 2) when it differs,
    conv2_forward_rate conv2's forward's (2) when it differs again (Tensor Cores); dgrad_rate
    and wgrad_rate, when given, the rates of conv2's data gradient (4) and weight gradient (5)
    over their nonzero taps only."""
    a, n = act_bytes, batch
    fwd = forward_rate or conv2_rate
    f = lambda mac: 2.0 * mac * n  # noqa: E731  FLOPs of `mac` multiply-adds per image
    k = 1.0 if not sparse else NONZERO
    w = 4  # master weights, gradients, Adam state and the weight gradients' partial sums stay f32
    chunks = -(-n // 4)  # the weight gradients' partial sums: one per 4 images
    cuda = FP32_RATE * EFFICIENCY
    rows = [
        ("1 gather + conv1 + bias + ReLU + pool", n * (X + P1 * a + P1), f(MAC["conv1"]), fwd),
        ("2 conv2 + bias + ReLU + pool", n * (P1 * a + P2 * a + P2) + 18496 * a, f(MAC["conv2"]),
         conv2_forward_rate or fwd),
        ("3a head, per sample", n * 2 * P2 * a + 102464 * a, 2 * f(MAC["dense"] + MAC["dense_1"]), cuda),
        ("3b head, weight gradients", n * (P2 * a + 2 * 64 * a) + 102464 * 2 * w, f(MAC["dense"] + MAC["dense_1"]), cuda),
        ("4 pool2 bwd + mask + conv2 dx", n * (P2 * a + P2 + P2 * a + P1 * a) + 18496 * a,
         (NONZERO if dgrad_rate else k) * f(MAC["conv2"]), dgrad_rate or (conv2_rate if not sparse else cuda)),
        ("5 conv2 dW + db, partial sums (in 4's launch)", n * (P1 * a + P2 * a + P2) + chunks * 18496 * w,
         (NONZERO if wgrad_rate else k) * f(MAC["conv2"]), wgrad_rate or (conv2_rate if not sparse else cuda)),
        ("6 pool1 bwd + mask + conv1 dW + db, partial sums", n * (P1 * a + P1 + X) + chunks * 320 * w, f(MAC["conv1"]),
         conv2_rate),
        ("7 conv2's and conv1's sums, batch cursor" + ("" if act_bytes == 2 else ", step count"),
         (chunks + 1) * (18496 + 320) * w + 16, chunks * (18496 + 320), cuda),
        ("8a Adam", PARAMS * 7 * w, PARAMS * 12, cuda),
    ]
    if act_bytes == 2:  # FP16: the loss scaler's inf/NaN check first, the count and the scale after
        rows.insert(8, ("8 unscale + check gradients", PARAMS * (2 + 4), PARAMS, cuda))
        rows.append(("8b Adam's step count, the loss scale", 16, 1, cuda))
    return rows


def rides_along(name):
    """Whether the kernel of this row runs in the previous row's launch."""
    return "launch)" in name


def predict(batch, act_bytes, conv2_rate, sparse, forward_rate=None, dgrad_rate=None, wgrad_rate=None,
            conv2_forward_rate=None):
    """(rows, µs a step, ms an epoch); a row is (name, MB, MFLOP, µs, what bounds it). A kernel
    that rides in the one before's launch ("in 4's launch") adds its time, not a floor or a node."""
    rows, total = [], 0.0
    for name, bytes_, flops, rate in kernels(batch, act_bytes, conv2_rate, sparse, forward_rate, dgrad_rate,
                                             wgrad_rate, conv2_forward_rate):
        shared = rides_along(name)
        floor = 0.0 if shared else FLOOR_US
        t = max(floor, bytes_ / BANDWIDTH * 1e6, flops / rate * 1e6)
        bound = "floor" if t == floor else ("memory" if t == bytes_ / BANDWIDTH * 1e6 else "arithmetic")
        rows.append((name, bytes_ / 1e6, flops / 1e6, t, bound))
        total += t + (0.0 if shared else NODE_US)
    step = total + REPLAY_US / STEPS_PER_REPLAY
    steps = -(-EPOCH_IMAGES // batch)
    return rows, step, step * steps / 1e3


def as_written(batch, act_bytes, tensor_cores=True):
    """The kernels as the fused step runs them: the forward tiled (a warp per pooled position,
    the weights in shared memory: the tuned rate), conv2's forward on Tensor Cores (TF32 in
    FP32, half in FP16, at WMMA_EFFICIENCY) unless tensor_cores is False (train_mnist
    --no-tf32: CUDA cores), conv2's gradients over the pooling winners' nonzero taps only
    (GATHER_EFFICIENCY, TAPS_EFFICIENCY), conv1's weight gradient one thread per parameter."""
    variant = AS_WRITTEN[act_bytes] if tensor_cores else AS_WRITTEN_CUDA_CORES[act_bytes]
    return predict(batch, act_bytes, *variant[2:])


# (title, activation bytes, the convolutions' rate, sparse gradients, the forward's rate if
# other, conv2's data and weight gradients' rates over their nonzero taps if other, conv2's
# forward's rate if other again)
PLAIN, TUNED = FP32_RATE * PLAIN_EFFICIENCY, FP32_RATE * EFFICIENCY
GATHER, TAPS = FP32_RATE * GATHER_EFFICIENCY, FP32_RATE * TAPS_EFFICIENCY
AS_WRITTEN = {
    4: ("FP32, as written: conv2's forward on TF32 Tensor Cores, its gradients over the winners' taps", 4, PLAIN,
        False, TUNED, GATHER, TAPS, TF32_RATE * WMMA_EFFICIENCY),
    2: ("FP16, as written: conv2's forward on half Tensor Cores", 2, PLAIN, False, TUNED, GATHER, TAPS,
        FP16_RATE * WMMA_EFFICIENCY),
}
AS_WRITTEN_CUDA_CORES = {
    4: ("FP32 with --no-tf32, as written: conv2's forward tiled on CUDA cores", 4, PLAIN, False, TUNED, GATHER, TAPS,
        None),
    2: ("FP16 with --no-tf32, as written: conv2's forward tiled on CUDA cores", 2, PLAIN, False, TUNED, GATHER, TAPS,
        None),
}
VARIANTS = [
    ("FP32, all plain (one thread per output)", 4, PLAIN, False, None, None, None, None),
    AS_WRITTEN[4],
    AS_WRITTEN[2],
    AS_WRITTEN_CUDA_CORES[4],
    ("FP32, conv2 on CUDA cores, dense gradients", 4, TUNED, False, None, None, None, None),
    ("FP32, conv2 on CUDA cores, sparse gradients", 4, TUNED, True, None, None, None, None),
    ("FP32 as TF32 on Tensor Cores for conv2, sparse gradients", 4, TF32_RATE * TC_EFFICIENCY, True, None, None, None,
     None),
    ("FP16, conv2 on Tensor Cores, dense gradients", 2, FP16_RATE * TC_EFFICIENCY, False, None, None, None, None),
]


def main():
    md = "--markdown" in sys.argv[1:]
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    for batch in (64, 1024):
        for title, *variant in VARIANTS:
            rows, step, epoch = predict(batch, *variant)
            print(f"\n### Batch {batch}: {title}\n" if md else f"\n== batch {batch}: {title}")
            if md:
                print("| kernel | MB moved | MFLOP | predicted µs | bound by |")
                print("|---|---|---|---|---|")
            for name, mb, mflop, t, bound in rows:
                if md:
                    print(f"| {name} | {mb:.2f} | {mflop:.1f} | {t:.1f} | {bound} |")
                else:
                    print(f"  {name:52s} {mb:9.2f} MB {mflop:9.1f} MFLOP {t:8.1f} us  ({bound})")
            nodes = sum(1 for r in rows if not rides_along(r[0]))
            line = (f"{nodes} graph nodes ({nodes * NODE_US:.1f} µs), replay {REPLAY_US / STEPS_PER_REPLAY:.1f} µs a step: "
                    f"**{step:.0f} µs a step, {epoch:.1f} ms an epoch** (predicted)")
            print(("\n" if md else "  ") + line)


if __name__ == "__main__":
    main()
