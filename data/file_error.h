// file_error.h: the one error for "this file has this problem", whatever the file is: a data
// file (IDX, an MNIST folder's files), a checkpoint or an image. what() is one line,
// "<path>: <problem>"; kind() says which sort of file it was, for a caller that reports them
// differently. DataError, CheckpointError and ImageError name the kinds.
#pragma once

#include <stdexcept>
#include <string>

namespace mf {

class FileError : public std::runtime_error {
 public:
  enum class Kind { kData, kCheckpoint, kImage };
  FileError(Kind kind, const std::string& path, const std::string& problem)
      : std::runtime_error(path + ": " + problem), kind_(kind), path_(path), problem_(problem) {}
  Kind kind() const { return kind_; }
  const std::string& path() const { return path_; }
  const std::string& problem() const { return problem_; }

 private:
  Kind kind_;
  std::string path_, problem_;
};

}  // namespace mf
