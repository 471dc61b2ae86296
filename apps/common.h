// common.h: pieces the apps share: default paths, hardware description, metrics JSON,
// the GPU report for --verbose, one-line error messages.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/sequential.h"
#include "runtime/errors.h"  // one_line

namespace mf::apps {

// $MF_DATA_DIR if set, else the project's data cache (.cache/mnist in the source tree).
std::string default_data_dir();

// "AMD EPYC, 2 threads" or "NVIDIA H200, sm_90, 132 SMs, 140 GiB".
std::string hardware_description(Device device, int gpu_index);
std::string cpu_model_name();

// Writes `text` to `path` atomically (io/atomic_file.h: a temporary file in the same
// folder, synced, then renamed over the target), so a crash never leaves half a file.
void write_file_atomic(const std::string& path, const std::string& text);

// Throws std::invalid_argument ("--FLAG PATH: ...") when write_bytes_atomic could not write
// `path` (output_target in atomic_file.h says when). The apps call it before any long work;
// an empty path passes.
void check_output_path(const char* flag, const std::string& path);

// True when `a` and `b` name the same file: the same inode when both exist (hard links and
// symlinks included), else the same path once folders and symlinks are resolved.
bool same_file(const std::string& a, const std::string& b);

// The first of `files` that names the same file as `path` (same_file), or "" when none does.
std::string same_file_among(const std::string& path, const std::vector<std::string>& files);

// The four MNIST files in `data_dir` (data::find_mnist_files), found but not read; none when
// the folder does not hold them all, as then nothing there is read (the loader says why).
// The apps compare their output paths with these, so that no output overwrites the data.
std::vector<std::string> data_files_in(const std::string& data_dir);

// For the start of main: opens /dev/null, read-only, on each of descriptors 0, 1 and 2 that
// the program was started without (`2>&-`). Else the next file it opens takes that number,
// and a message meant for stderr (a signal's note, say) lands inside a checkpoint being
// saved. Read-only, so that writing there still fails and a closed stdout is still reported.
void reserve_standard_fds();

// For the start of main of a program that writes files: SIGPIPE and SIGXFSZ are ignored, so
// that a closed pipe (`prog | head`) or the file-size limit (ulimit -f) makes the write fail
// (EPIPE, EFBIG), to be reported and cleaned up after (a temporary file removed, a run
// saved), instead of ending the program mid-write without a word.
void write_failures_are_errors();

// For the end of main: `status`, or 1 with a one-line error when writing standard output
// failed (a full disk, a closed pipe), which would otherwise lose the results in silence.
// A program that already failed or was stopped (status not 0) has said why: that stays the
// one line (Ctrl-C on `train_mnist | tee log` also ends tee, and is no write error).
int exit_status_after_stdout(const char* program, int status);

// `s` as a JSON string literal, quotes included: '"' and '\\' escaped, control characters
// turned into spaces (messages stay on one line), and bytes that are not well-formed UTF-8
// (a path such as $'dat\xff') replaced by U+FFFD, so the file always parses as JSON.
std::string json_string(const std::string& s);

struct RunInfo {
  Device device;
  bool fp16;
  std::int64_t batch_size;
  int threads;
  std::string hardware, data_dir;
  std::int64_t seed;
  bool deterministic;  // the run gives the same bits when repeated (CPU, or GPU --deterministic)
};
void write_metrics_json(const std::string& path, const RunInfo& info, const History& h, const EvalResult& test,
                        Sequential& model);

// Per-layer GPU configuration (algorithms, math mode, precision) and device memory.
void print_gpu_report(Sequential& model, bool fp16);
// --verbose on the CPU: which kernels each layer ran last, and how sparse the
// convolutions' output gradients were.
void print_cpu_report(Sequential& model);

}  // namespace mf::apps
