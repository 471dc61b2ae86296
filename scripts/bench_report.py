#!/usr/bin/env python3
"""bench_report.py: turns the Google Benchmark JSON files of scripts/bench.sh into
OUT_DIR/results.md (one table per claim of the article, a summary, and the kernel ladder of
bench_ladder) and PNG charts.

    python3 scripts/bench_report.py OUT_DIR [MORE_DIR ...]

With more folders (e.g. the GPU half measured on one machine, the CPU half on another), a
benchmark is taken from the first folder that has it measured; the report lists each
folder's machine and goes into OUT_DIR.

The charts are drawn with matplotlib (Debian's python3-matplotlib, which scripts/bench.sh
installs); where it is missing (the GPU machine has no network to install it) the tables
are still written and one line says that the charts are not.
"""
import datetime
import glob
import json
import os
import sys

NO_GPU = "not measured (no GPU)"

# ----------------------------------------------------------------------------------------
# Reading the results
# ----------------------------------------------------------------------------------------

UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
STANDARD_KEYS = {
    "name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
    "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit", "label",
    "error_occurred", "error_message", "aggregate_name", "aggregate_unit", "bytes_per_second",
    "items_per_second",
}


class Row:
    """One benchmark: its group and parameters (from the name), time per iteration, counters."""

    def __init__(self, entry):
        tokens = entry["name"].split("/")
        self.group = tokens[0]
        self.params = {}
        for t in tokens[1:]:
            if ":" in t:
                k, v = t.split(":", 1)
                if k not in ("iterations", "repeats", "min_time", "threads"):
                    self.params[k] = v
        self.error = entry.get("error_message") if entry.get("error_occurred") else None
        self.seconds = entry.get("real_time", 0.0) * UNIT_SECONDS.get(entry.get("time_unit", "ns"), 1e-9)
        self.label = entry.get("label", "")
        self.counters = {k: v for k, v in entry.items() if k not in STANDARD_KEYS and isinstance(v, (int, float))}
        if "bytes_per_second" in entry:
            self.counters["bytes_per_second"] = entry["bytes_per_second"]

    def get(self, key, default=None):
        return self.counters.get(key, default)


class Results:
    def __init__(self, dirs):
        self.rows = []
        self.context = {}
        self.files = []
        self.sources = []  # (folder, its context) in order
        for d in dirs:
            self._load(d)

    def _load(self, out_dir):
        ctx_here = {}
        for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                print(f"bench_report: skipping {path}: {e}", file=sys.stderr)
                continue
            if not isinstance(data, dict) or "benchmarks" not in data:
                continue
            self.files.append(path)
            for k, v in data.get("context", {}).items():
                self.context.setdefault(k, v)
                ctx_here.setdefault(k, v)
            for entry in data["benchmarks"]:
                if entry.get("run_type", "iteration") != "iteration":
                    continue
                self.rows.append(Row(entry))
        if ctx_here:
            self.sources.append((out_dir, ctx_here))

    def find(self, group, **params):
        """The measured row of `group` whose parameters include `params` (None if absent or failed)."""
        want = {k: str(v) for k, v in params.items()}
        for r in self.rows:
            if r.group == group and r.error is None and all(r.params.get(k) == v for k, v in want.items()):
                return r
        return None

    def all(self, group, **params):
        want = {k: str(v) for k, v in params.items()}
        return [r for r in self.rows if r.group == group and r.error is None
                and all(r.params.get(k) == v for k, v in want.items())]

    def gpu_measured(self):
        return any(r.error is None and r.params.get("dev", "").startswith("gpu") for r in self.rows)

    def gpu_skip_reason(self):
        for r in self.rows:
            if r.error and r.error.startswith("no GPU"):
                return r.error
        return None


# ----------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------

def fmt_time(s):
    if s is None:
        return "-"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms" if s < 0.01 else f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_rate(flops):
    if flops is None:
        return "-"
    if flops >= 1e12:
        return f"{flops / 1e12:.2f} TFLOP/s"
    return f"{flops / 1e9:.3g} GFLOP/s"


def fmt_x(r):
    if r is None:
        return "-"
    return f"{r:.3g}x" if r < 100 else f"{r:.0f}x"


def fmt_mib(v):
    return "-" if v is None else f"{v:.1f} MiB"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def secs(row):
    return row.seconds if row is not None else None


NO_GPU_MODE = [False]  # set once: True when no GPU result exists at all


def gpu_cell(text):
    return NO_GPU if NO_GPU_MODE[0] else text


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------
# Charts (matplotlib)
# ----------------------------------------------------------------------------------------

BLACK, GREY, LIGHT = (20, 20, 20), (110, 110, 110), (225, 225, 225)
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]
W, H, DPI = 1000, 560, 100  # pixels of each PNG


def rgb(c):
    return tuple(v / 255 for v in c)


_plt = None  # matplotlib.pyplot, imported at the first chart; False when it is not installed


def pyplot():
    global _plt
    if _plt is None:
        try:
            import matplotlib
            matplotlib.use("Agg")  # files only, no display
            import matplotlib.pyplot as plt
            _plt = plt
        except ImportError:
            _plt = False
            print("bench_report: note: no matplotlib (Debian: python3-matplotlib; scripts/bench.sh installs it): "
                  "the tables are written, the charts are not", file=sys.stderr)
    return _plt


def figure(title, xlabel, ylabel, note=None):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(W / DPI, H / DPI), dpi=DPI)
    ax.set_title(title, loc="left", fontsize=13)
    ax.set_xlabel(xlabel, color=rgb(GREY))
    ax.set_ylabel(ylabel, color=rgb(GREY))
    ax.grid(True, which="major", color=rgb(LIGHT), linewidth=0.8)
    ax.set_axisbelow(True)
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, color=rgb(GREY), wrap=True, va="bottom")
    return fig, ax


def plain_log_ticks(axis, minor=True):
    """Tick labels on a log axis as plain numbers ("0.5", "3", "200"), not powers of ten; the
    minor ticks unlabelled when `minor` is False (an axis over several decades)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter
    label = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(label)
    axis.set_minor_formatter(label if minor else NullFormatter())


def save(fig, path):
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path)
    pyplot().close(fig)


def empty_chart(path, title, message):
    if not pyplot():
        return
    fig, ax = figure(title, "", "")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=14, color=rgb(GREY), transform=ax.transAxes)
    save(fig, path)


def line_chart(path, title, xlabel, ylabel, series, xlog2=True, hline=None, band=None, note=None):
    """series: [(label, color, [(x, y), ...], dashed)]; y on a log scale; x on log2 when xlog2."""
    if not pyplot():
        return
    if not any(p[1] and p[1] > 0 for s in series for p in s[2]):
        empty_chart(path, title, "no data")
        return
    fig, ax = figure(title, xlabel, ylabel, note)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    if xlog2:
        ax.set_xscale("log", base=2)
    xs = sorted({p[0] for s in series for p in s[2] if p[1] and p[1] > 0})
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{v:g}" for v in xs])
    if band:
        ax.axhspan(band[0], band[1], color=(1.0, 0.925, 0.78), zorder=0)
    if hline:
        ax.axhline(hline, color=rgb(GREY), linestyle="--", linewidth=1.5)
    for label, color, data, dashed in series:
        data = sorted(p for p in data if p[1] and p[1] > 0)
        ax.plot([x for x, _ in data], [y for _, y in data], color=rgb(color), linestyle="--" if dashed else "-",
                marker="o", markersize=4, linewidth=2, label=label)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=9)
    save(fig, path)


def bar_chart(path, title, ylabel, groups, names, values, note=None, value_fmt=fmt_time, minor_labels=True):
    """values[g][i]: bar i of group g (None: missing); log y."""
    if not pyplot():
        return
    if not any(v for g in values for v in g):
        empty_chart(path, title, "no data")
        return
    fig, ax = figure(title, "", ylabel, note)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis, minor_labels)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [gi - 0.4 + (i + 0.5) * width for gi in range(len(groups))]
        vs = [values[gi][i] for gi in range(len(groups))]
        kept = [(x, v) for x, v in zip(xs, vs) if v]
        bars = ax.bar([x for x, _ in kept], [v for _, v in kept], width * 0.9,
                      color=rgb(PALETTE[i % len(PALETTE)]), label=name)
        ax.bar_label(bars, labels=[value_fmt(v) for _, v in kept], fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=9)
    save(fig, path)


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------

BATCHES = [8, 16, 32, 64, 128, 256, 512, 1024]
EPOCH_IMAGES = 48000


def steps_per_epoch(batch):
    return -(-EPOCH_IMAGES // batch)


def gpu_epoch(res, batch, dev="gpu_fp32", mode="graph", pipeline="resident"):
    return res.find("epoch", dev=dev, mode=mode, pipeline=pipeline, batch=batch)


LADDER = [("naive", "cpu_1t", "CPU naive, 1 thread"), ("naive", "cpu_mt", "CPU naive, all threads"),
          ("library", "cpu_1t", "CPU library, 1 thread"), ("library", "cpu_mt", "CPU library, all threads"),
          ("tuned", "cpu_1t", "CPU tuned, 1 thread"), ("tuned", "cpu_mt", "CPU tuned, all threads"),
          ("naive", "gpu_fp32", "GPU naive, FP32"), ("naive", "gpu_fp16", "GPU naive, FP16"),
          ("library", "gpu_fp32", "GPU library, FP32"), ("library", "gpu_fp16", "GPU library, FP16"),
          ("fused", "gpu_fp32", "GPU fused, FP32"), ("fused", "gpu_fp16", "GPU fused, FP16")]
LADDER_BATCHES = [64, 1024]


def ladder_section(res, md):
    """The ladder table (bench_ladder): every rung's step, and its speedup over CPU naive on one
    thread at the same batch. Returns {batch: [images/s or None per LADDER entry]} for the chart."""
    md.append("## The kernel ladder: one training step at every rung\n")
    md.append("`bench_ladder`: one training step of the model (forward, loss, backward, Adam) at each rung of "
              "`train_mnist --kernels` (docs/gpu_vs_cpu.md). *Speedup* divides images/s by CPU naive on one "
              "thread at the same batch. *Steps* is how many steps the time is the mean of, after a warm-up step "
              "(GPU rows: one epoch of `Sequential::fit`, its graph capture included).\n")
    rows, values = [], {}
    for batch in LADDER_BATCHES:
        base = res.find("ladder", rung="naive", dev="cpu_1t", batch=batch)
        base_rate = base.get("images/s") if base else None
        values[batch] = []
        for rung, dev, name in LADDER:
            r = res.find("ladder", rung=rung, dev=dev, batch=batch)
            rate = r.get("images/s") if r else None
            values[batch].append(rate)
            missing = gpu_cell("not measured yet") if dev.startswith("gpu") else "-"
            # CPU rows time one step; GPU rows a whole epoch of `steps` steps.
            per_step = (secs(r) / r.get("steps", 1) if dev.startswith("gpu") and r.get("steps") else secs(r)) if r else None
            rows.append([name, batch, fmt_time(per_step) if r else missing,
                         f"{rate:,.0f}" if rate else missing, fmt_x(ratio(rate, base_rate)) if r else missing,
                         f"{r.get('steps', 0):.0f}" if r else "-"])
    md.append(table(["rung", "batch", "time / step", "images/s", "speedup", "steps"], rows))
    return values


# bench_fused's launches and the rows of scripts/fused_model.py they cover.
# (bench_fused's launch, the model's rows it covers, whether the model's rows are the Tensor
# Core ones: conv2_fwd is the CUDA-core forward that --no-tf32 runs)
FUSED_KERNELS = [("conv1_fwd", ("1 ",), True), ("conv2_fwd", ("2 ",), False), ("conv2_fwd_tc", ("2 ",), True),
                 ("head", ("3a ", "3b "), True), ("conv2_dgrad", ("4 ",), True), ("conv2_wgrad", ("5 ",), True),
                 ("conv2_bwd", ("4 ", "5 "), True), ("conv1_wgrad", ("6 ",), True), ("wgrad_sums", ("7 ",), True)]


def fused_section(res, md):
    """bench_fused's time per launch beside the fused-step model's prediction for the kernels
    as written (fused_model.as_written, docs/fused_step.md); nothing when bench_fused did not
    run on a GPU."""
    if not any(res.all("fused")):
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fused_model  # noqa: E402  (the model beside this script)
    md.append("## The fused step, launch by launch: measured against the model\n")
    md.append("`bench_fused`: each launch of `--kernels fused`'s step on its own, 20 back to back, CUDA-event "
              "time per launch (no graph). *Predicted*: `scripts/fused_model.py` for the kernels as written "
              "(the forward tiled, conv2's on Tensor Cores in `conv2_fwd_tc` and on CUDA cores in `conv2_fwd`, "
              "conv2's gradients over the pooling winners' taps, conv1's weight gradient one thread per "
              "parameter), its graph-node costs left out.\n")
    rows = []
    for batch in LADDER_BATCHES:
        for dev, act in (("gpu_fp32", 4), ("gpu_fp16", 2)):
            model_rows = {tc: fused_model.as_written(batch, act, tc)[0] for tc in (True, False)}
            for kernel, prefixes, tc in FUSED_KERNELS:
                r = res.find("fused", kernel=kernel, dev=dev, batch=batch)
                predicted = sum(t for name, _, _, t, _ in model_rows[tc] if name.startswith(prefixes))
                measured = secs(r) * 1e6 if r else None
                rows.append([kernel, dev, batch, f"{measured:.1f} µs" if measured is not None else "-",
                             f"{predicted:.1f} µs", fmt_x(ratio(measured, predicted)) if measured else "-"])
    md.append(table(["launch", "device", "batch", "measured", "predicted", "measured / predicted"], rows))


def ladder_chart(path, values):
    """One bar per measured rung and device, grouped by batch; the unmeasured ones are named in
    the note rather than given a legend entry without a bar."""
    groups = [f"batch {b}" for b in LADDER_BATCHES]
    kept = [i for i in range(len(LADDER)) if any(values[b][i] for b in LADDER_BATCHES)]
    missing = [LADDER[i][2] for i in range(len(LADDER)) if i not in kept]
    note = "bench_ladder: one training step (forward, loss, backward, Adam)"
    if missing:
        note += "; not measured yet: " + ", ".join(missing)
    bar_chart(path, "The kernel ladder: images/s of one training step", "images / s (log)", groups,
              [LADDER[i][2] for i in kept], [[values[b][i] for i in kept] for b in LADDER_BATCHES],
              note=note, value_fmt=lambda v: f"{v:,.0f}", minor_labels=False)


def report(out_dir, more_dirs=()):
    # A folder to read that is not there is a typo, not half a report; OUT_DIR, where the
    # report goes, is made when the results come from the other folders.
    for d in more_dirs:
        if not os.path.isdir(d):
            sys.exit(f"bench_report: error: {d} is not a folder")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        sys.exit(f"bench_report: error: {out_dir} is not a folder")
    res = Results([out_dir] + list(more_dirs))
    if not res.rows:
        sys.exit(f"bench_report: no benchmark JSON in {', '.join([out_dir] + list(more_dirs))}")
    os.makedirs(out_dir, exist_ok=True)
    NO_GPU_MODE[0] = not res.gpu_measured()
    gpu_reason = res.gpu_skip_reason()
    ctx = res.context
    md = []
    summary = []  # (claim, article, cpu, gpu, holds)

    # ---- header ----
    md.append("# microflow benchmarks: the article's nine claims\n")
    md.append(f"Report written {datetime.datetime.now().isoformat(timespec='seconds')}.\n")
    for folder, c in res.sources:
        md.append(f"Results in `{folder}`:\n")
        md.append(f"- Date: {c.get('date', '?')}")
        md.append(f"- CPU: {c.get('mf_cpu_model', 'unknown')}, {c.get('mf_threads', c.get('num_cpus', '?'))} "
                  f"hardware threads (host {c.get('host_name', '?')})")
        md.append(f"- GPU: {c.get('mf_gpu', 'unknown')}")
        if c.get("load_avg"):
            md.append("- Load average when the first suite started (1, 5, 15 min): " +
                      ", ".join(f"{v:.1f}" for v in c["load_avg"]) +
                      f" on {c.get('num_cpus', '?')} CPUs: anything above the CPU count means other work was "
                      "competing for the cores")
        md.append(f"- Build: microflow {c.get('mf_build', '?')} build; Google Benchmark reports its own library "
                  f"as a {c.get('library_build_type', '?')} build (so does Debian's package; the library only "
                  f"times, the code under test is our Release build)")
        md.append(f"- Result files: {', '.join(os.path.basename(f) for f in res.files if os.path.dirname(f) == folder.rstrip('/'))}")
        cmd_file = os.path.join(folder, "commands.txt")
        if os.path.exists(cmd_file):
            with open(cmd_file) as f:
                md.append("- Commands:\n\n```\n" + f.read().strip() + "\n```")
        md.append("")
    md.append("\nTimes are per iteration as Google Benchmark reports them: CPU timings are wall time of the "
              "project's fast CPU path (its thread pool at all threads, `cpu_mt`, or one, `cpu_1t`); GPU "
              "timings are CUDA-event time (`UseManualTime`) or, for whole epochs, `EpochLog::train_seconds` "
              "of `Sequential::fit`. An epoch is 48,000 synthetic images (timings do not depend on pixel values). "
              "The machines are shared: expect a few percent of noise, more on the 2-core CPU.")
    if NO_GPU_MODE[0]:
        md.append(f"\n**No GPU on this machine** ({gpu_reason or 'no GPU result'}): every GPU number below is "
                  f"\"{NO_GPU}\"; run `scripts/bench.sh` on a GPU machine for them.")
    md.append("\n## Summary\n")
    summary_at = len(md)

    # ---- claim 1: GEMM ----
    md.append("## Claim 1: a large matrix product is 50-100x faster on the GPU\n")
    md.append("C = A·B, square n x n x n, FP32 unless said. CPU: Eigen, rows split across the thread pool "
              "(`cpu_mt`) or one thread. GPU: cuBLAS on data already in device memory (`cublasSgemm` default "
              "math = true FP32; TF32 Tensor Cores; `cublasGemmEx` FP16 inputs/outputs with FP32 accumulation); "
              "`fp32 + copies` adds the PCIe copies of A and B in and C out (pinned memory). Cell: time (rate).\n")
    sizes = sorted({int(r.params["n"]) for r in res.all("gemm")})
    devs = [("cpu_1t", "CPU 1 thread"), ("cpu_mt", "CPU all threads"), ("gpu_fp32", "GPU FP32"),
            ("gpu_tf32", "GPU TF32"), ("gpu_fp16", "GPU FP16"), ("gpu_fp32_copies", "GPU FP32 + copies")]
    rows = []
    gemm_series = {d: [] for d, _ in devs}
    speed_series = {d: [] for d, _ in devs if d.startswith("gpu")}
    for n in sizes:
        cells = [str(n)]
        cpu = res.find("gemm", dev="cpu_mt", n=n) or res.find("gemm", dev="cpu_1t", n=n)
        for d, _ in devs:
            r = res.find("gemm", dev=d, n=n)
            if r is None:
                cells.append(gpu_cell("-") if d.startswith("gpu") else "-")
                continue
            cells.append(f"{fmt_time(r.seconds)} ({fmt_rate(r.get('FLOP/s'))})")
            gemm_series[d].append((n, r.get("FLOP/s", 0) / 1e9))
            if d.startswith("gpu") and cpu:
                speed_series[d].append((n, cpu.seconds / r.seconds))
        f32 = res.find("gemm", dev="gpu_fp32", n=n)
        f16 = res.find("gemm", dev="gpu_fp16", n=n)
        cells.append(gpu_cell(fmt_x(ratio(secs(cpu), secs(f32)))) if cpu else "-")
        cells.append(gpu_cell(fmt_x(ratio(secs(cpu), secs(f16)))) if cpu else "-")
        rows.append(cells)
    md.append(table(["n"] + [name for _, name in devs] + ["GPU FP32 speedup", "GPU FP16 speedup"], rows))
    md.append("Speedups are over the CPU at all threads (one thread where that is all there is).\n")
    # crossover: the smallest n from which the GPU (FP32) wins at every larger size
    crossover = None
    common = [n for n in sizes if res.find("gemm", dev="cpu_mt", n=n) and res.find("gemm", dev="gpu_fp32", n=n)]
    for n in common:
        if all(res.find("gemm", dev="gpu_fp32", n=m).seconds < res.find("gemm", dev="cpu_mt", n=m).seconds
               for m in common if m >= n):
            crossover = n
            break
    top = common[-1] if common else None
    top_cpu = res.find("gemm", dev="cpu_mt", n=top) if top else None
    top_f32 = res.find("gemm", dev="gpu_fp32", n=top) if top else None
    top_f16 = res.find("gemm", dev="gpu_fp16", n=top) if top else None
    cpu_top = res.find("gemm", dev="cpu_mt", n=max(sizes)) if sizes else None
    if NO_GPU_MODE[0]:
        md.append(f"Crossover and GPU/CPU ratio: {NO_GPU}.\n")
    elif top:
        md.append(f"**Crossover:** the GPU (FP32) is faster than the CPU from n = {crossover} on. "
                  f"**At n = {top}:** GPU FP32 is {fmt_x(ratio(top_cpu.seconds, top_f32.seconds))} and "
                  f"GPU FP16 {fmt_x(ratio(top_cpu.seconds, secs(top_f16)))} faster than the CPU.\n")
    rows = []
    for r in res.all("gemm_model", dev="cpu_mt") or res.all("gemm_model", dev="cpu_1t"):
        shape = r.params["shape"]
        cells = [shape, f"{r.params['m']}x{r.params['n']}x{r.params['k']}"]
        for d in ("cpu_1t", "cpu_mt", "gpu_fp32", "gpu_fp16"):
            x = res.find("gemm_model", dev=d, shape=shape)
            cells.append(f"{fmt_time(x.seconds)} ({fmt_rate(x.get('FLOP/s'))})" if x else
                         (gpu_cell("-") if d.startswith("gpu") else "-"))
        rows.append(cells)
    if rows:
        md.append("The model's own products (convolutions as im2col GEMMs, m = output pixels of the batch, "
                  "n = filters, k = window x channels) are small and thin: far from the sizes where the GPU's "
                  "advantage is large.\n")
        md.append(table(["GEMM", "m x n x k", "CPU 1 thread", "CPU all threads", "GPU FP32", "GPU FP16"], rows))
    if cpu_top:
        cpu_text = f"{fmt_rate(cpu_top.get('FLOP/s'))} at n = {cpu_top.params['n']} (all threads)"
    else:
        cpu_text = "-"
    if NO_GPU_MODE[0] or not top_f32:
        gpu_text, holds = NO_GPU, NO_GPU
    else:
        r32 = ratio(top_cpu.seconds, top_f32.seconds)
        r16 = ratio(top_cpu.seconds, secs(top_f16))
        gpu_text = (f"FP32 {fmt_rate(top_f32.get('FLOP/s'))}, FP16 {fmt_rate(top_f16.get('FLOP/s')) if top_f16 else '-'}"
                    f" at n = {top}; crossover n = {crossover}")
        verdict = ("yes, more than claimed" if r32 > 100 else "yes") if r32 >= 50 else \
            ("partly" if r32 >= 10 or (r16 or 0) >= 50 else "no")
        holds = f"{verdict}: {fmt_x(r32)} in FP32, {fmt_x(r16)} in FP16 at n = {top}"
    summary.append(("1", "large matrix product 50-100x faster on the GPU", cpu_text, gpu_text, holds))

    # ---- claim 2: epoch on CPU vs GPU; layers ----
    md.append("## Claim 2: an epoch takes tens of seconds on a CPU and a few seconds on a GPU\n")
    cpu_mt = res.find("epoch", dev="cpu_mt", batch=64)
    cpu_1t = res.find("epoch", dev="cpu_1t", batch=64)
    g64 = gpu_epoch(res, 64)
    g64h = gpu_epoch(res, 64, dev="gpu_fp16")
    rows = [["CPU, all threads", fmt_time(secs(cpu_mt)), "measured: one epoch of `fit`"],
            ["CPU, 1 thread", fmt_time(secs(cpu_1t)), "measured: one epoch of `fit`"],
            ["GPU FP32, CUDA graph, data resident", gpu_cell(fmt_time(secs(g64))), "one epoch of `fit`"],
            ["GPU FP16, CUDA graph, data resident", gpu_cell(fmt_time(secs(g64h))), "one epoch of `fit`"]]
    md.append("Seconds per epoch at the article's batch 64 (48,000 images):\n")
    md.append(table(["where", "epoch", "how"], rows))
    md.append("For reference, the same model in PyTorch (the design notes and anchors/README.md; measured "
              "earlier on the same machines, not by this run): on the 2-core development machine, PyTorch 1.13's CPU path takes "
              "10.2 s per epoch at batch 64 as installed and 3.8 s tuned; on the H200, PyTorch 2.11 takes "
              "1616 ms (data on the GPU, eager FP32), 2150 ms (DataLoader) and 302 ms (CUDA graph, FP32).\n")
    md.append("Each layer alone (forward, or backward = input and weight gradients; the first convolution "
              "needs no input gradient), time per call:\n")
    rows = []
    layer_names = ["conv2d", "max_pooling2d", "conv2d_1", "max_pooling2d_1", "dense", "dense_1", "loss"]
    for name in layer_names:
        order = {"fwd": 0, "bwd": 1, "fwd_bwd": 2}
        for r in sorted(res.all("layer", layer=name, dev="cpu_1t"),
                        key=lambda r: (int(r.params["batch"]), order.get(r.params["dir"], 3))):
            d, b = r.params["dir"], r.params["batch"]
            cells = [name, d, b]
            for dev in ("cpu_1t", "cpu_mt", "gpu_fp32", "gpu_fp16"):
                x = res.find("layer", layer=name, dir=d, batch=b, dev=dev)
                cells.append(fmt_time(x.seconds) if x else (gpu_cell("-") if dev.startswith("gpu") else "-"))
            rows.append(cells)
    md.append(table(["layer", "dir", "batch", "CPU 1 thread", "CPU all threads", "GPU FP32", "GPU FP16"], rows))
    rows = []
    for b in ("64", "1024"):
        for dev, label in (("cpu_1t", "1 thread"), ("cpu_mt", "all threads")):
            sparse = res.find("layer", layer="conv2d_1", dir="bwd", batch=b, dev=dev)
            dense = res.find("layer", layer="conv2d_1", dir="bwd", batch=b, dev=dev + "_dense_grad")
            if sparse and dense:
                rows.append([b, label, fmt_time(dense.seconds), fmt_time(sparse.seconds),
                             f"{dense.seconds / sparse.seconds:.1f}x"])
    if rows:
        md.append("The second convolution's backward gets, as in training, a gradient that has come back "
                  "through max-pooling and ReLU, mostly zeros. The CPU path skips them (sparse kernels); "
                  "`--dense-grad` multiplies them like a dense convolution library:\n")
        md.append(table(["batch", "CPU", "dense tiles", "sparse", "speedup"], rows))
    if cpu_mt:
        cpu_text = f"{fmt_time(cpu_mt.seconds)} (all threads), {fmt_time(secs(cpu_1t))} (1 thread), batch 64"
    else:
        cpu_text = "-"
    if g64 is None:
        gpu_text, holds = NO_GPU, ("CPU: " + ("yes" if cpu_mt and cpu_mt.seconds >= 10 else "no, well under tens of "
                                              "seconds") + f"; GPU {NO_GPU}") if cpu_mt else NO_GPU
    else:
        gpu_text = f"{fmt_time(g64.seconds)} (FP32, graph), batch 64"
        parts = []
        if cpu_mt:
            parts.append("CPU " + ("yes" if cpu_mt.seconds >= 10 else "no: faster than tens of seconds"))
        parts.append("GPU " + ("yes" if 1 <= g64.seconds < 10 else ("faster than claimed" if g64.seconds < 1 else "no")))
        if cpu_mt:
            parts.append(f"GPU {fmt_x(cpu_mt.seconds / g64.seconds)} faster")
        holds = "; ".join(parts)
    summary.append(("2", "tens of seconds per epoch on a CPU, a few seconds on a GPU", cpu_text, gpu_text, holds))

    # ---- claim 3: pipelines ----
    md.append("## Claim 3: naive per-step slicing starves the GPU; a prefetching pipeline can double speed\n")
    md.append("Epoch time (FP32) by input pipeline: `resident` keeps the u8 data set on the GPU and gathers "
              "batches there; `prefetch` gathers on a host thread into pinned buffers and copies on a second "
              "stream while the GPU trains; `naive` slices into pageable memory, copies and waits every step.\n")
    rows = []
    pipe_vals = []
    for b in (64, 1024):
        for mode in ("graph", "eager"):
            cells = [str(b), mode]
            vals = []
            for p in ("resident", "prefetch", "naive"):
                r = gpu_epoch(res, b, mode=mode, pipeline=p)
                vals.append(secs(r))
                cells.append(gpu_cell(fmt_time(secs(r))))
            cells.append(gpu_cell(fmt_x(ratio(vals[2], vals[1]))))
            cells.append(gpu_cell(fmt_x(ratio(vals[2], vals[0]))))
            rows.append(cells)
            pipe_vals.append((f"batch {b} {mode}", vals))
    md.append(table(["batch", "step", "resident", "prefetch", "naive", "prefetch vs naive", "resident vs naive"], rows))
    n64 = gpu_epoch(res, 64, pipeline="naive")
    p64 = gpu_epoch(res, 64, pipeline="prefetch")
    r64 = gpu_epoch(res, 64, pipeline="resident")
    if n64 and p64:
        rp, rr = n64.seconds / p64.seconds, n64.seconds / secs(r64) if r64 else None
        holds = ("yes" if rp >= 2 else ("resident only" if rr and rr >= 2 else "no")) + \
            f": prefetch {fmt_x(rp)}, resident {fmt_x(rr)} faster than naive (batch 64, graph)"
        gpu_text = f"naive {fmt_time(n64.seconds)}, prefetch {fmt_time(p64.seconds)}, resident {fmt_time(secs(r64))}"
    else:
        gpu_text = holds = NO_GPU
    summary.append(("3", "a prefetching pipeline can double speed over naive slicing", "n/a (GPU claim)", gpu_text, holds))

    # ---- claim 4: batch size ----
    md.append("## Claim 4: a bigger batch uses the GPU better (batch 8 -> 32 cut the time by over 40 %)\n")
    md.append("CPU: one training step (forward, loss, backward, Adam) timed on its own; the epoch is projected "
              "as step time x steps. GPU: one real epoch of `fit` (data resident), per step = epoch / steps.\n")
    rows = []
    cols = [("cpu_1t", None), ("cpu_mt", None), ("gpu_fp32", "graph"), ("gpu_fp32", "eager"), ("gpu_fp16", "graph"),
            ("gpu_fp16", "eager")]
    epoch_series = {}
    for b in BATCHES:
        cells = [str(b)]
        for dev, mode in cols:
            if dev.startswith("cpu"):
                r = res.find("step", dev=dev, batch=b)
                if r:
                    e = r.seconds * steps_per_epoch(b)
                    cells.append(f"{fmt_time(r.seconds)} / {fmt_time(r.seconds / b)} / {fmt_time(e)}")
                    epoch_series.setdefault((dev, mode), []).append((b, e))
                else:
                    cells.append("-")
            else:
                r = gpu_epoch(res, b, dev=dev, mode=mode)
                if r:
                    st = r.seconds / steps_per_epoch(b)
                    cells.append(f"{fmt_time(st)} / {fmt_time(r.seconds / EPOCH_IMAGES)} / {fmt_time(r.seconds)}")
                    epoch_series.setdefault((dev, mode), []).append((b, r.seconds))
                else:
                    cells.append(NO_GPU)
        rows.append(cells)
    md.append("Cell: time per step / per image / per epoch.\n")
    md.append(table(["batch", "CPU 1 thread (projected)", "CPU all threads (projected)", "GPU FP32 graph",
                     "GPU FP32 eager", "GPU FP16 graph", "GPU FP16 eager"], rows))

    def cut(series):
        d = dict(series or [])
        return 1 - d[32] / d[8] if 8 in d and 32 in d else None

    cpu_cut = cut(epoch_series.get(("cpu_mt", None)))
    gpu_cut = cut(epoch_series.get(("gpu_fp32", "graph")))
    gpu_cut_eager = cut(epoch_series.get(("gpu_fp32", "eager")))
    cpu_text = f"8 -> 32 cuts the epoch by {cpu_cut:.0%} (all threads)" if cpu_cut is not None else "-"
    if gpu_cut is None:
        gpu_text = NO_GPU
        holds = (f"CPU {'yes' if cpu_cut > 0.4 else 'no'}; GPU {NO_GPU}") if cpu_cut is not None else NO_GPU
    else:
        gpu_text = f"8 -> 32 cuts the epoch by {gpu_cut:.0%} (graph), {gpu_cut_eager:.0%} (eager)"
        holds = "GPU " + ("yes" if gpu_cut > 0.4 else "no") + \
            (f"; CPU {'yes' if cpu_cut > 0.4 else 'no'}" if cpu_cut is not None else "")
    summary.append(("4", "batch 8 -> 32 cuts the time by over 40 %", cpu_text, gpu_text, holds))

    # ---- claim 5: FP16 ----
    md.append("## Claim 5: mixed precision is faster on Tensor Cores and halves activation memory\n")
    rows = []
    for b in BATCHES:
        cells = [str(b)]
        for mode in ("graph", "eager"):
            a, h = gpu_epoch(res, b, mode=mode), gpu_epoch(res, b, dev="gpu_fp16", mode=mode)
            cells += [gpu_cell(fmt_time(secs(a))), gpu_cell(fmt_time(secs(h))), gpu_cell(fmt_x(ratio(secs(a), secs(h))))]
        rows.append(cells)
    md.append("Epoch time, FP32 vs FP16 (speedup = FP32 / FP16):\n")
    md.append(table(["batch", "FP32 graph", "FP16 graph", "speedup", "FP32 eager", "FP16 eager", "speedup"], rows))
    md.append("Memory of one training step: `activations` = the layers' outputs (kept for backward) by "
              "arithmetic; `step allocations` = what the caching allocator handed out during the first step "
              "beyond the model, optimizer state and input (outputs, input gradients, pooling argmax, loss "
              "gradient); the shared cuDNN workspace is grown to its limit before the step, so neither "
              "side counts it.\n")
    rows = []
    mem_ratio = None
    for b in (64, 1024, 4096):
        a = res.find("memory_step", dev="gpu_fp32", batch=b)
        h = res.find("memory_step", dev="gpu_fp16", batch=b)
        cells = [str(b)]
        for r in (a, h):
            cells += [gpu_cell(fmt_mib(r.get("activations_MiB")) if r else "-"),
                      gpu_cell(fmt_mib(r.get("step_alloc_MiB")) if r else "-")]
        cells.append(gpu_cell(f"{ratio(h.get('step_alloc_MiB'), a.get('step_alloc_MiB')):.2f}" if a and h else "-"))
        if a and h and b == 1024:
            mem_ratio = ratio(h.get("step_alloc_MiB"), a.get("step_alloc_MiB"))
        rows.append(cells)
    md.append(table(["batch", "FP32 activations", "FP32 step allocations", "FP16 activations",
                     "FP16 step allocations", "FP16 / FP32 allocations"], rows))
    a1024, h1024 = gpu_epoch(res, 1024), gpu_epoch(res, 1024, dev="gpu_fp16")
    a64, h64 = gpu_epoch(res, 64), gpu_epoch(res, 64, dev="gpu_fp16")
    if a1024 and h1024:
        s1024, s64 = ratio(a1024.seconds, h1024.seconds), ratio(secs(a64), secs(h64))
        gpu_text = f"FP16 speedup {fmt_x(s64)} (batch 64), {fmt_x(s1024)} (batch 1024), graph" + \
            (f"; step memory x{mem_ratio:.2f}" if mem_ratio else "")
        holds = ("faster: " + ("yes" if s1024 > 1.05 else "no") + "; memory halved: " +
                 (("yes" if mem_ratio <= 0.6 else "no") if mem_ratio else "-"))
    else:
        gpu_text = holds = NO_GPU
    summary.append(("5", "FP16 is faster and halves activation memory", "n/a (FP16 runs on the GPU only)", gpu_text, holds))

    # ---- claim 6: graph vs eager ----
    md.append("## Claim 6: a compiled graph beats eager execution, up to ten times\n")
    md.append("The whole step (gather, forward, loss, backward, Adam) captured once as a CUDA graph and replayed, "
              "against launching its kernels one by one from the host every step.\n")
    rows = []
    ge_vals = []
    best = None
    for dev in ("gpu_fp32", "gpu_fp16"):
        for b in BATCHES:
            g, e = gpu_epoch(res, b, dev=dev, mode="graph"), gpu_epoch(res, b, dev=dev, mode="eager")
            x = ratio(secs(e), secs(g))
            rows.append([dev.replace("gpu_", "").upper(), str(b), gpu_cell(fmt_time(secs(e))),
                         gpu_cell(fmt_time(secs(g))), gpu_cell(fmt_x(x))])
            if b in (64, 1024):
                ge_vals.append((f"{dev.replace('gpu_', '').upper()} batch {b}", [secs(g), secs(e)]))
            if x and (best is None or x > best[0]):
                best = (x, dev, b)
    md.append(table(["precision", "batch", "eager epoch", "graph epoch", "graph speedup"], rows))
    g64e = gpu_epoch(res, 64, mode="eager")
    g1024, g1024e = gpu_epoch(res, 1024), gpu_epoch(res, 1024, mode="eager")
    if g64 and g64e:
        x64, x1024 = ratio(g64e.seconds, g64.seconds), ratio(secs(g1024e), secs(g1024))
        gpu_text = f"graph {fmt_x(x64)} faster at batch 64, {fmt_x(x1024)} at 1024 (FP32)"
        holds = ("yes" if best and best[0] >= 10 else ("partly" if x64 >= 2 else "no")) + \
            (f": up to {fmt_x(best[0])} ({best[1].replace('gpu_', '').upper()}, batch {best[2]})" if best else "")
    else:
        gpu_text = holds = NO_GPU
    summary.append(("6", "a compiled graph beats eager execution, up to 10x", "n/a (GPU claim)", gpu_text, holds))

    # ---- claim 7: memory ----
    md.append("## Claim 7: a framework grabs GPU memory up front; a limit keeps it to a set amount\n")
    md.append("microflow grabs nothing up front: the caching allocator takes from `cudaMalloc` what the step "
              "needs and keeps freed blocks for reuse. During one FP32 epoch (data resident, 37 MB of it):\n")
    rows = []
    for r in sorted(res.all("memory_epoch"), key=lambda r: int(r.params["batch"])):
        rows.append([r.params["batch"], fmt_mib(r.get("peak_MiB")), fmt_mib(r.get("reserved_MiB")),
                     fmt_mib(r.get("device_used_delta_MiB")), fmt_time(r.seconds)])
    if not rows:
        rows.append(["-", NO_GPU, NO_GPU, NO_GPU, NO_GPU])
    md.append(table(["batch", "allocator peak", "allocator reserved", "device memory used (delta)", "epoch"], rows))
    md.append("Under `--gpu-memory-limit` (`DeviceAllocator::set_limit`), doubling the batch from 32 until "
              "`OutOfMemoryError` (3 steps each, fresh model):\n")
    rows = []
    limit_ok = None
    for r in sorted(res.all("memory_limit"), key=lambda r: int(r.params["limit_mib"])):
        ok = r.get("peak_within_limit") == 1
        limit_ok = ok if limit_ok is None else (limit_ok and ok)
        rows.append([f"{r.params['limit_mib']} MiB", f"{int(r.get('max_ok_batch', 0)) or 'none'}",
                     f"{int(r.get('first_oom_batch', 0)) or 'none up to 65536'}", fmt_mib(r.get("max_peak_MiB")),
                     "yes" if ok else "**no**", r.label.replace("|", "/")[:160]])
    if not rows:
        rows.append(["-", NO_GPU, NO_GPU, NO_GPU, NO_GPU, ""])
    md.append(table(["limit", "largest batch that trains", "first batch that fails", "largest peak",
                     "peak within limit", "the error"], rows))
    ep = {int(r.params["batch"]): r for r in res.all("memory_epoch")}
    if ep and limit_ok is not None:
        b0 = min(ep)
        gpu_text = (f"peak {fmt_mib(ep[b0].get('peak_MiB'))} at batch {b0} .. "
                    f"{fmt_mib(ep[max(ep)].get('peak_MiB'))} at {max(ep)}; nothing reserved up front")
        holds = "limit respected: " + ("yes" if limit_ok else "NO") + "; up-front grab: no (by design, allocate on demand)"
    else:
        gpu_text = holds = NO_GPU
    summary.append(("7", "memory grabbed up front; a limit caps it", "n/a (GPU claim)", gpu_text, holds))

    # ---- claim 8: cuDNN algorithms ----
    md.append("## Claim 8: cuDNN autotuning picks faster convolution algorithms\n")
    md.append("Each convolution with its algorithms chosen by cuDNN's heuristic (`cudnnGet*_v7`, "
              "`KernelOptions::find = false`) or by timing the candidates (`cudnnFind*Ex`, `find = true`). "
              "`first call` is the wall time of the first call, which makes the choice.\n")
    rows = []
    speedups = []
    order = {"fwd": 0, "bwd": 1, "gpu_fp32": 0, "gpu_fp16": 1}
    for r in sorted(res.all("cudnn", algo="heuristic"),
                    key=lambda r: (r.params["layer"], order.get(r.params["dir"], 2), order.get(r.params["dev"], 2),
                                   int(r.params["batch"]))):
        p = r.params
        t = res.find("cudnn", layer=p["layer"], dir=p["dir"], batch=p["batch"], dev=p["dev"], algo="timed")
        x = ratio(r.seconds, secs(t))
        if x:
            speedups.append(x)
        first = "first_bwd_ms" if p["dir"] == "bwd" else "first_fwd_ms"
        rows.append([p["layer"], p["dir"], p["batch"], p["dev"].replace("gpu_", "").upper(), fmt_time(r.seconds),
                     fmt_time(secs(t)), fmt_x(x), f"{r.get(first, 0):.1f} ms",
                     f"{t.get(first, 0):.1f} ms" if t else "-",
                     (t.label if t else r.label).replace("|", "/")])
    if rows:
        md.append(table(["layer", "dir", "batch", "precision", "heuristic", "timed", "timed speedup",
                         "first call (heuristic)", "first call (timed)", "algorithms (timed)"], rows))
        gpu_text = f"timed vs heuristic: {min(speedups):.2f}x .. {max(speedups):.2f}x per convolution"
        holds = ("yes" if max(speedups) >= 1.1 else "no measurable gain") + \
            ("" if min(speedups) >= 0.95 else "; sometimes slower (timing noise or a different workspace)")
    else:
        md.append(table(["layer", "dir", "batch", "precision", "heuristic", "timed"],
                        [["conv2d, conv2d_1", "fwd, bwd", "64, 1024", "FP32, FP16", NO_GPU, NO_GPU]]))
        gpu_text = holds = NO_GPU
    summary.append(("8", "cuDNN autotuning picks faster convolutions", "n/a (GPU claim)", gpu_text, holds))

    # ---- claim 9: busy fraction ----
    md.append("## Claim 9: a well-fed GPU stays above 90 % busy\n")
    md.append("Method (no CUPTI profiler): the device time of one step is measured by capturing the step "
              "(forward, loss, backward, Adam; same model and batch) into a CUDA graph and replaying it 200 times "
              "back to back between two CUDA events; the host enqueues replays faster than they run, so that is "
              "the GPU's own time, including the ~1 µs gaps between a graph's kernels (the fraction leans high "
              "by those; the missing batch gather, a few µs, leans it low). busy = device time per step x steps "
              "/ the wall time of a real epoch of `fit` in the configuration.\n")
    rows = []
    busy_graph = None
    for r in res.all("busy"):
        p = r.params
        rows.append([p["dev"].replace("gpu_", "").upper(), p["mode"], p["pipeline"], p["batch"],
                     f"{r.get('device_step_us', 0):.1f} µs", f"{r.get('wall_step_us', 0):.1f} µs",
                     f"{100 * r.get('busy', 0):.0f} %"])
        if p["dev"] == "gpu_fp32" and p["mode"] == "graph" and p["pipeline"] == "resident":
            busy_graph = busy_graph or {}
            busy_graph[int(p["batch"])] = r.get("busy", 0)
    if not rows:
        rows.append(["FP32, FP16", "graph, eager", "resident, prefetch, naive", "64, 1024", NO_GPU, NO_GPU, NO_GPU])
    md.append(table(["precision", "step", "pipeline", "batch", "GPU time / step", "wall time / step", "busy"], rows))
    if busy_graph:
        gpu_text = ", ".join(f"{100 * v:.0f} % at batch {b}" for b, v in sorted(busy_graph.items())) + " (FP32, graph, resident)"
        holds = "yes" if max(busy_graph.values()) >= 0.9 else "no"
    else:
        gpu_text = holds = NO_GPU
    summary.append(("9", "a well-fed GPU stays above 90 % busy", "n/a (GPU claim)", gpu_text, holds))

    # ---- the kernel ladder ----
    ladder = ladder_section(res, md)
    fused_section(res, md)

    # ---- charts ----
    md.append("## Charts\n")
    charts = []
    ladder_chart(os.path.join(out_dir, "ladder.png"), ladder)
    charts.append(("ladder.png", "The kernel ladder: images per second of one training step at every rung"))
    series = [(name, PALETTE[i], gemm_series[d], d.endswith("copies")) for i, (d, name) in enumerate(devs) if gemm_series[d]]
    line_chart(os.path.join(out_dir, "gemm_gflops.png"), "GEMM throughput, n x n x n", "n (log scale)",
               "GFLOP/s (log)", series)
    charts.append(("gemm_gflops.png", "GEMM throughput by size"))
    if NO_GPU_MODE[0]:
        empty_chart(os.path.join(out_dir, "gemm_speedup.png"), "GEMM speedup, GPU over CPU (all threads)", NO_GPU)
    else:
        series = [(name, PALETTE[i], speed_series[d], d.endswith("copies"))
                  for i, (d, name) in enumerate(devs) if d in speed_series and speed_series[d]]
        line_chart(os.path.join(out_dir, "gemm_speedup.png"), "GEMM speedup, GPU over CPU (all threads)",
                   "n (log scale)", "speedup (log)", series, hline=1.0, band=(50, 100),
                   note="shaded: the article's 50-100x; dashed line: break-even")
    charts.append(("gemm_speedup.png", "GEMM speedup of the GPU over the CPU by size"))
    names = {("cpu_1t", None): "CPU 1 thread", ("cpu_mt", None): "CPU all threads",
             ("gpu_fp32", "graph"): "GPU FP32 graph", ("gpu_fp32", "eager"): "GPU FP32 eager",
             ("gpu_fp16", "graph"): "GPU FP16 graph", ("gpu_fp16", "eager"): "GPU FP16 eager"}
    series = [(names[k], PALETTE[i], epoch_series[k], k[1] == "eager") for i, k in enumerate(names) if k in epoch_series]
    if cpu_mt:
        series.append(("CPU fit, measured", BLACK, [(64, cpu_mt.seconds)], False))
    line_chart(os.path.join(out_dir, "epoch_vs_batch.png"), "Seconds per epoch (48,000 images) by batch size",
               "batch size (log scale)", "seconds (log)", series,
               note="CPU: projected from the step time; GPU: measured epochs" +
               ("" if not NO_GPU_MODE[0] else f"; GPU {NO_GPU}"))
    charts.append(("epoch_vs_batch.png", "Time per epoch by batch size, CPU and GPU"))
    if NO_GPU_MODE[0]:
        empty_chart(os.path.join(out_dir, "pipelines.png"), "Epoch time by input pipeline", NO_GPU)
        empty_chart(os.path.join(out_dir, "graph_vs_eager.png"), "CUDA graph vs eager steps", NO_GPU)
    else:
        bar_chart(os.path.join(out_dir, "pipelines.png"), "Epoch time by input pipeline (FP32)", "seconds (log)",
                  [g for g, _ in pipe_vals], ["resident", "prefetch", "naive"], [v for _, v in pipe_vals])
        bar_chart(os.path.join(out_dir, "graph_vs_eager.png"), "Epoch time: CUDA graph vs eager", "seconds (log)",
                  [g for g, _ in ge_vals], ["graph", "eager"], [v for _, v in ge_vals])
    charts.append(("pipelines.png", "Epoch time by input pipeline"))
    charts.append(("graph_vs_eager.png", "Epoch time, CUDA graph vs eager"))
    for f, alt in charts:
        md.append(f"![{alt}]({f})\n")

    md.insert(summary_at, table(["#", "the article says", "CPU", "GPU", "holds?"],
                                [list(s) for s in summary]))
    errors = [r for r in res.rows if r.error and not r.error.startswith("no GPU")]
    if errors:
        md.append("## Benchmarks that failed\n")
        md.append(table(["benchmark", "error"], [[r.group + " " + " ".join(f"{k}:{v}" for k, v in r.params.items()),
                                                  r.error.replace("|", "/")[:200]] for r in errors]))
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    drawn = len(charts) if pyplot() else 0
    print(f"bench_report: wrote {os.path.join(out_dir, 'results.md')} and {drawn} charts")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: bench_report.py OUT_DIR [MORE_DIR ...] (folders with the benchmark JSON files)")
    report(sys.argv[1], sys.argv[2:])
