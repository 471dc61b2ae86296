// atomic_file.h: durable, all-or-nothing file writes (checkpoints, plots, PNG grids).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace mf::io {

// Writes `size` bytes to `path` so that a reader sees either the old file or the whole new
// one, never a mix, even if the process or the machine dies half way:
//   1. a NEW temporary file in the SAME folder (rename is only atomic within one file
//      system), 2. write everything, fsync it (the data reach the disk before the name
//      does), 3. rename() over the target, 4. fsync the folder (the rename itself).
// The temporary file is created with O_EXCL | O_NOFOLLOW: whatever already has its name (a
// stale file, or a symlink someone planted in a shared folder to get its target truncated)
// is left alone and the next name is tried, up to kAtomicTempAttempts names.
// A file replaced keeps its permission bits (and its owner and group where the process may
// set them); a new file gets 0644 less the umask.
// On any failure the temporary file is removed, the old `path` is left as it was, and
// std::runtime_error says "<path>: <what failed>: <strerror>".
// A `path` that is a symlink to a file has that file replaced (the link stays); one that is
// a device or a pipe (/dev/stdout, /dev/null, a FIFO) is written in place, not replaced.
void write_bytes_atomic(const std::string& path, const void* data, std::size_t size);

// Where a write to `path` goes, judged once for write_bytes_atomic and for the apps' check
// before any long work (check_output_path): `file` is written in place when it is a device
// or a pipe (a symlink to one included), else a new file replaces `file`: `path` itself, or
// the file a symlink points to. Throws std::runtime_error "<path>: <why not>" when no write
// could go there: a folder (an existing one, or any path ending in '/'), a symlink to a
// missing file or a loop, a folder to replace the file in that is missing or not writable,
// a device or pipe that is not writable.
struct OutputTarget {
  bool in_place = false;
  std::string file;
};
OutputTarget output_target(const std::string& path);

// For a signal handler that ends the process (train_mnist's second Ctrl-C): removes the
// temporary file of the write_bytes_atomic in progress, if there is one, so that quitting
// in the middle of a save leaves neither a damaged file nor a stray "<path>.tmp.<pid>".
// Async-signal-safe (an atomic load and unlink). Only one write is tracked at a time: one
// started while another is in progress on another thread is not.
void remove_temp_file_in_progress() noexcept;

// For a program that has no use for Ctrl-C of its own (predict): SIGINT, SIGTERM and SIGHUP
// remove the temporary file of the write_bytes_atomic in progress, if any, then end the
// process with the signal's default action, so the shell still sees 130, 143 or 129.
// Without it, a stop in the middle of writing a --grid PNG left "<path>.tmp.<pid>" behind.
void remove_temp_file_on_stop_signals();

// The temporary names write_bytes_atomic tries, in order: "<path>.tmp.<pid>" (attempt 0),
// then "<path>.tmp.<pid>.<attempt>" for attempt 1 .. kAtomicTempAttempts - 1. The file's
// own name is cut short where the whole would pass the 255-byte limit of a name.
constexpr int kAtomicTempAttempts = 8;
std::string atomic_temp_name(const std::string& path, int attempt);

// `message` without its leading "<path>: " (the errors above start so), for callers that
// put the path in front themselves (CheckpointError, ImageError).
std::string without_path(const std::string& path, const std::string& message);

// The folder `path` is in: "." for a bare name, "/" for one at the root.
std::string parent_dir(const std::string& path);

// Called with the first bytes of a file being read (at least kHeadCheckBytes of them, or
// the whole file when it is shorter), before the rest is read: it throws to stop reading
// a file of the wrong kind at once (a checkpoint reader handed /dev/zero, which never ends).
using HeadCheck = std::function<void(const std::string& head)>;
constexpr std::size_t kHeadCheckBytes = 64;

// Reads a whole file (a pipe or a device to its end). Throws std::runtime_error "<path>: <why>" if it cannot be opened or
// read, or is larger than `max_bytes` (a guard against reading a disk image by mistake),
// and lets what `check_head` throws, if given, through.
std::string read_file_bytes(const std::string& path, std::size_t max_bytes = std::size_t{1} << 32,
                            const HeadCheck& check_head = nullptr);

}  // namespace mf::io
