// atomic_file.cpp: temp file + fsync + rename (see atomic_file.h).
#include "io/atomic_file.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace mf::io {

namespace {

std::string error_text(const std::string& path, const std::string& what, int err) {
  return path + ": " + what + ": " + std::strerror(err);
}

// The temporary file of the write in progress, published for remove_temp_file_in_progress.
// The name is copied into a static buffer (a signal handler must not follow a pointer
// into a std::string that another thread may free). State: 0 free, 1 being filled in by
// the writer that took it, 2 published.
char g_temp_name[4096];
std::atomic<int> g_temp_state{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler reads g_temp_state");

// Publishes `tmp` for the lifetime of the guard, if the slot is free and the name fits.
class TempFileInProgress {
 public:
  explicit TempFileInProgress(const std::string& tmp) {
    int expected = 0;
    if (tmp.size() >= sizeof g_temp_name || !g_temp_state.compare_exchange_strong(expected, 1)) return;
    std::memcpy(g_temp_name, tmp.c_str(), tmp.size() + 1);
    g_temp_state.store(2);
    owner_ = true;
  }
  ~TempFileInProgress() {
    if (owner_) g_temp_state.store(0);
  }
  TempFileInProgress(const TempFileInProgress&) = delete;
  TempFileInProgress& operator=(const TempFileInProgress&) = delete;

 private:
  bool owner_ = false;
};

}  // namespace

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string without_path(const std::string& path, const std::string& message) {
  return message.rfind(path + ": ", 0) == 0 ? message.substr(path.size() + 2) : message;
}

void remove_temp_file_in_progress() noexcept {
  if (g_temp_state.load() == 2) (void)::unlink(g_temp_name);
}

namespace {
// Async-signal-safe: unlink (in remove_temp_file_in_progress) and raise. SA_RESETHAND has
// put the default action back before this runs, so the raise ends the process.
extern "C" void remove_temp_file_and_stop(int sig) {
  remove_temp_file_in_progress();
  (void)::raise(sig);
}
}  // namespace

void remove_temp_file_on_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = remove_temp_file_and_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) (void)::sigaction(sig, &sa, nullptr);
}

std::string atomic_temp_name(const std::string& path, int attempt) {
  std::string suffix = ".tmp." + std::to_string(::getpid());
  if (attempt != 0) suffix += "." + std::to_string(attempt);
  // A file's own name may be up to NAME_MAX (255) bytes long: one near that is cut short so
  // that its temporary name is not refused as too long, after all the work, at the save.
  const std::size_t slash = path.find_last_of('/'), start = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t keep = std::min(path.size() - start, std::size_t{NAME_MAX} - suffix.size());
  return path.substr(0, start + keep) + suffix;
}

namespace {

// Writes everything to fd, retrying short writes and EINTR; false with errno set on failure.
bool write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// A device or a pipe (/dev/stdout, /dev/null, a FIFO): written in place, as a shell
// redirection would; replacing it with a regular file would break it for everyone.
void write_in_place(const std::string& path, const void* data, std::size_t size) {
  std::fflush(nullptr);  // /dev/stdout: what the program printed before comes first
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(error_text(path, "cannot open", errno));
  if (!write_all(fd, data, size)) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(error_text(path, "write failed", err));
  }
  if (::close(fd) != 0) throw std::runtime_error(error_text(path, "close failed", errno));
}

}  // namespace

OutputTarget output_target(const std::string& path) {
  auto refuse = [&](const std::string& why) { throw std::runtime_error(path + ": " + why); };
  if (path.empty()) throw std::runtime_error("write: empty file name");
  struct stat st {}, lst {};
  const bool exists = ::stat(path.c_str(), &st) == 0;  // follows symlinks
  const int stat_err = exists ? 0 : errno;
  if (exists && S_ISDIR(st.st_mode)) refuse("is a folder, not a file");
  if (path.back() == '/') refuse("ends in '/': names a folder, not a file");
  if (exists && !S_ISREG(st.st_mode)) {
    // A device or a pipe (/dev/stdout, a FIFO) is written in place: the file itself must be
    // writable, its folder need not be (/dev is not).
    if (::access(path.c_str(), W_OK) != 0) refuse("is not writable");
    return {true, path};
  }
  // A symlink has its target replaced, so the target's folder is the one written to. A
  // symlink to a missing file is refused: files are not created through links.
  std::string target = path;
  if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    if (!exists) {
      std::error_code ec;
      const std::string to = std::filesystem::read_symlink(path, ec).string();
      const std::string points = ec ? "" : " (" + to + ")";
      if (stat_err == ELOOP) refuse("is a symlink loop" + points);
      if (stat_err != ENOENT && stat_err != ENOTDIR)  // EACCES on the way to the target, say
        refuse("cannot follow the symlink" + points + ": " + std::strerror(stat_err));
      refuse("is a symlink to a missing file" + points);
    }
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (!resolved) refuse(std::string("cannot resolve the symlink: ") + std::strerror(errno));
    target = resolved;
    std::free(resolved);
  }
  const std::size_t name_bytes = target.size() - (target.find_last_of('/') + 1);  // npos + 1 is 0
  if (name_bytes > NAME_MAX)
    refuse("the file's name is " + std::to_string(name_bytes) + " bytes long, more than the " +
           std::to_string(NAME_MAX) + " a name can have");
  const std::string dir = parent_dir(target);
  const std::string shown = target == path ? dir : dir + " (where the symlink points)";
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))  // access() alone passes a file
    refuse(shown + " is a file, not a folder");
  if (::access(dir.c_str(), W_OK) != 0) refuse("folder " + shown + " does not exist or is not writable");
  return {false, target};
}

void write_bytes_atomic(const std::string& path, const void* data, std::size_t size) {
  const OutputTarget out = output_target(path);
  if (out.in_place) return write_in_place(out.file, data, size);
  const std::string& file = out.file;  // a symlink's target: the link stays a link
  // A fresh file only: O_EXCL fails (EEXIST) on any existing name, a symlink included, so
  // nothing outside this file is ever opened or truncated; O_NOFOLLOW says the same twice.
  // A name that is taken is somebody's: try the next one rather than remove it.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < kAtomicTempAttempts && fd < 0; ++attempt) {
    tmp = atomic_temp_name(file, attempt);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) throw std::runtime_error(error_text(file, "cannot create " + tmp, errno));
  }
  if (fd < 0)
    throw std::runtime_error(error_text(file, "cannot create a temporary file (" + atomic_temp_name(file, 0) +
                                                  " and the next " + std::to_string(kAtomicTempAttempts - 1) +
                                                  " names are taken)",
                                        EEXIST));
  // Until the guard goes, after the rename or the unlink below: a signal arriving in
  // between makes the handler unlink a name that is already gone, which is harmless.
  const TempFileInProgress in_progress(tmp);
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(error_text(file, what, err));
  };
  // The file replaced keeps its permissions (a private checkpoint stays private) and, where
  // this process may give it, its owner and group, as a write in place would keep them.
  struct stat old {};
  if (::stat(file.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
    if (old.st_uid != ::geteuid() || old.st_gid != ::getegid()) (void)!::fchown(fd, old.st_uid, old.st_gid);
    if (::fchmod(fd, old.st_mode & 07777) != 0) fail("cannot give " + tmp + " the permissions of the file it replaces");
  }
  if (!write_all(fd, data, size)) fail("write failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(error_text(file, "close failed", err));
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(error_text(file, "cannot rename " + tmp + " into place", err));
  }
  // The new name must survive a power cut too: flush the folder entry. Failure here is
  // not an error for the caller (the data are in place; some file systems refuse it).
  const int dfd = ::open(parent_dir(file).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

namespace {
// Closes a file descriptor when it goes out of scope, whatever is thrown in between.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};
}  // namespace

std::string read_file_bytes(const std::string& path, std::size_t max_bytes, const HeadCheck& check_head) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(error_text(path, "cannot open", errno));
  const FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error(error_text(path, "cannot stat", errno));
  if (S_ISDIR(st.st_mode)) throw std::runtime_error(path + ": is a folder, not a file");
  // A regular file says its size: refuse a large one before reading a byte. A pipe or a
  // device (/dev/stdin, a process substitution, /dev/zero) says nothing; it is read to its
  // end within the same limit, and check_head sees its first bytes before the rest is read.
  std::string out;
  if (S_ISREG(st.st_mode)) {
    if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
      throw std::runtime_error(path + ": too large (" + std::to_string(st.st_size) + " bytes, at most " +
                               std::to_string(max_bytes) + " expected)");
    out.reserve(static_cast<std::size_t>(st.st_size));
  }
  bool head_checked = !check_head;
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(error_text(path, "read failed", errno));
    if (n == 0) break;
    out.append(chunk, static_cast<std::size_t>(n));
    if (!head_checked && out.size() >= kHeadCheckBytes) {
      head_checked = true;
      check_head(out);
    }
    // A regular file that grew while it was read is held to the same limit.
    if (out.size() > max_bytes)
      throw std::runtime_error(path + ": too large (more than " + std::to_string(max_bytes) + " bytes expected)");
  }
  if (!head_checked) check_head(out);  // shorter than kHeadCheckBytes: all of it
  return out;
}

}  // namespace mf::io
