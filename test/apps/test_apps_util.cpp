// test_apps_util.cpp: the apps' helpers on their own: the number flags' ranges in single
// precision, the training plot's axes for any values, the metrics JSON's strings, the
// output-path check that the apps run before training, and the live progress line.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "apps/common.h"
#include "apps/flags.h"
#include "apps/progress.h"
#include "train/sequential.h"
#include "tensor/rng.h"
#include "test/test_util.h"
#if MF_WITH_STB
#include "apps/plot.h"
#endif

namespace fs = std::filesystem;
using namespace mf;
using mf::testing::TempDir;

namespace {

// Parses one "--name value" with the number flags the apps declare (train_mnist's --lr,
// --momentum, --validation-split and --min-accuracy, doctor's --burn), with the same ranges.
// Returns the error, or "" when the value was taken (then *value holds it).
std::string parse_number(const std::string& name, const std::string& text, double* value) {
  double lr = 0.001, momentum = 0.9, split = 0.2, min_accuracy = 0, burn = 0;
  apps::Flags flags("prog", "");
  flags.add_double("lr", &lr, 1e-8, 10.0, "");
  flags.add_double("momentum", &momentum, 0.0, 1.0, "", /*hi_inclusive=*/false);
  flags.add_double("validation-split", &split, 0.0, 1.0, "", /*hi_inclusive=*/false);
  flags.add_double("min-accuracy", &min_accuracy, 0.0, 1.0, "");
  flags.add_double("burn", &burn, 0, 86400, "");
  std::string n = "--" + name, v = text;
  std::vector<char*> argv{const_cast<char*>("prog"), n.data(), v.data()};
  try {
    flags.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const apps::FlagError& e) {
    return e.what();
  }
  *value = name == "lr" ? lr : name == "momentum" ? momentum : name == "validation-split" ? split
           : name == "min-accuracy"                            ? min_accuracy
                                                               : burn;
  return "";
}

}  // namespace

// ---- number flags in single precision ----

// float(1e-8) is 9.99999994e-09, just below the double 1e-8. The documented minimum of --lr
// must still be accepted: an included bound, rounded to float, is still the bound.
TEST(Flags, IncludedBoundsAcceptValuesThatRoundPastThemInSinglePrecision) {
  double v = 0;
  EXPECT_EQ(parse_number("lr", "1e-8", &v), "");
  EXPECT_EQ(v, 1e-8);
  EXPECT_EQ(parse_number("lr", "10", &v), "");
  EXPECT_EQ(v, 10.0);
  EXPECT_EQ(parse_number("min-accuracy", "1", &v), "");
  EXPECT_EQ(parse_number("min-accuracy", "0.99999999999", &v), "");  // 1 in float: included
  EXPECT_EQ(parse_number("min-accuracy", "0", &v), "");
  EXPECT_EQ(parse_number("burn", "86400", &v), "");
  EXPECT_EQ(parse_number("momentum", "0", &v), "");
  EXPECT_EQ(parse_number("validation-split", "0", &v), "");
  // Below an included bound, or past one, in double: refused as before.
  EXPECT_EQ(parse_number("lr", "0.99999e-8", &v), "--lr must be in [1e-08, 10], got 0.99999e-8");
  EXPECT_EQ(parse_number("lr", "10.000001", &v), "--lr must be in [1e-08, 10], got 10.000001");
  EXPECT_EQ(parse_number("burn", "86400.01", &v), "--burn must be in [0, 86400], got 86400.01");
  // An excluded bound is checked on the float too: these round to exactly 1.
  EXPECT_EQ(parse_number("momentum", "0.99999999999", &v),
            "--momentum must be in [0, 1), got 0.99999999999 (1 in single precision)");
  EXPECT_EQ(parse_number("validation-split", "0.99999999999", &v),
            "--validation-split must be in [0, 1), got 0.99999999999 (1 in single precision)");
  EXPECT_EQ(parse_number("momentum", "0.9999999", &v), "");  // 0.99999988 in float: below 1
  EXPECT_EQ(v, 0.9999999);
}

// The single-precision value is printed with enough digits to tell it from the bound:
// float(0.1) is 0.100000001, above 0.1, which "%g" would have shown as "0.1" next to "0.1)".
TEST(Flags, SinglePrecisionValuesInMessagesAreNotRoundedToTheBound) {
  double y = 0;
  apps::Flags flags("prog", "");
  flags.add_double("y", &y, 0.0, 0.1, "", /*hi_inclusive=*/false);
  std::string n = "--y", v = "0.09999999999";
  std::vector<char*> argv{const_cast<char*>("prog"), n.data(), v.data()};
  try {
    flags.parse(static_cast<int>(argv.size()), argv.data());
    ADD_FAILURE() << "0.09999999999 is 0.100000001 in single precision, past the excluded 0.1";
  } catch (const apps::FlagError& e) {
    EXPECT_STREQ(e.what(), "--y must be in [0, 0.1), got 0.09999999999 (0.100000001 in single precision)");
  }
  EXPECT_FALSE(flags.accepts("y", 0.09999999999));  // checked the same way for saved values
  EXPECT_TRUE(flags.accepts("y", 0.0999999));
}

// accepts() checks saved values (a checkpoint's) as parsing checks typed ones.
TEST(Flags, AcceptsAgreesWithParsingAtTheBounds) {
  double lr = 0.001, momentum = 0.9;
  apps::Flags flags("prog", "");
  flags.add_double("lr", &lr, 1e-8, 10.0, "");
  flags.add_double("momentum", &momentum, 0.0, 1.0, "", /*hi_inclusive=*/false);
  EXPECT_TRUE(flags.accepts("lr", 1e-8));
  EXPECT_TRUE(flags.accepts("lr", 10.0));
  EXPECT_FALSE(flags.accepts("lr", 9.9e-9));
  EXPECT_TRUE(flags.accepts("momentum", 0.9999999));
  EXPECT_FALSE(flags.accepts("momentum", 0.99999999999));
  EXPECT_FALSE(flags.accepts("momentum", 1.0));
}

// ---- the training plot ----

#if MF_WITH_STB
namespace {

std::vector<EpochLog> history_of(const std::vector<std::vector<double>>& rows) {
  std::vector<EpochLog> h;
  for (const auto& r : rows) {  // loss, accuracy, val_loss, val_accuracy
    EpochLog e;
    e.epoch = static_cast<int>(h.size());
    e.loss = r[0], e.accuracy = r[1], e.val_loss = r[2], e.val_accuracy = r[3];
    h.push_back(e);
  }
  return h;
}

// How many pixels of the canvas have exactly this colour.
int count_colour(const apps::Canvas& cv, apps::Rgb c) {
  int n = 0;
  const auto& p = cv.pixels();
  for (std::size_t i = 0; i + 2 < p.size(); i += 3) n += p[i] == c.r && p[i + 1] == c.g && p[i + 2] == c.b;
  return n;
}

}  // namespace

// Whatever the numbers, the plot is drawn and the drawing ends: a loss near the largest
// double made the rounded top of the axis inf and the tick loop never stopped. Each history
// is first drawn in a child process that an alarm ends after 20 s, so a loop that does not
// end fails the test instead of hanging it; then drawn here, where its curves must show.
TEST(TrainingPlot, ExtremeValuesStillGiveAnAxisAndTheDrawingEnds) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = INFINITY;
  const std::vector<std::vector<std::vector<double>>> cases = {
      {{1.7e308, 0.1, 2.3, 0.1}, {0.5, 0.9, 0.4, 0.9}},  // a loss of 1.7e308: the tick loop never ended
      {{DBL_MAX, 0.1, DBL_MAX, 0.1}, {DBL_MAX, 0.2, DBL_MAX, 0.2}},
      {{-DBL_MAX, 0.5, DBL_MAX, 0.5}, {1, 0.5, 1, 0.5}},  // a range wider than a double
      {{1e300, 0.5, 1e300, 0.5}, {1e300, 0.5, 1e300, 0.5}},  // flat, huge
      {{5e-324, 1e-300, nan, nan}, {5e-324, 1e-300, nan, nan}},  // flat, tiny, no validation
      {{inf, nan, -inf, nan}, {nan, inf, nan, -inf}},  // nothing finite at all
      {{2.3, 7.5, 2.2, -3}, {1.1, 1e20, 1.0, 0.5}},  // accuracies far outside [0, 1]
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::vector<EpochLog> h = history_of(cases[i]);
    ASSERT_EXIT(
        {
          ::alarm(20);
          const apps::Canvas cv = apps::render_training_plot(h, "title");
          std::exit(cv.width() > 0 ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
    const apps::Canvas cv = apps::render_training_plot(h, "title");
    EXPECT_EQ(cv.width(), 1000);
    EXPECT_FALSE(cv.encode_png().empty());
  }
  // The 1.7e308 history: the training curve (blue) is drawn, not lost off the axis.
  const apps::Canvas cv = apps::render_training_plot(history_of(cases[0]));
  EXPECT_GT(count_colour(cv, {31, 119, 180}), 500);
}
#endif  // MF_WITH_STB

// ---- strings in the metrics JSON ----

// JSON text must be UTF-8: bytes that are not (a folder named $'dat\xff') become U+FFFD, one
// per maximal invalid part, as Python's decode("utf-8", "replace") does; valid characters
// of any length stay as they are.
TEST(MetricsJson, StringsAreAlwaysValidUtf8) {
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ(apps::json_string("dat\xff"), "\"dat" + r + "\"");
  EXPECT_EQ(apps::json_string("a\x80" "b"), "\"a" + r + "b\"");                  // a lone continuation byte
  EXPECT_EQ(apps::json_string("\xc0\xaf"), "\"" + r + r + "\"");                 // overlong '/'
  EXPECT_EQ(apps::json_string("\xed\xa0\x80"), "\"" + r + r + r + "\"");         // a surrogate
  EXPECT_EQ(apps::json_string("\xf4\x90\x80\x80"), "\"" + r + r + r + r + "\"");  // past U+10FFFF
  EXPECT_EQ(apps::json_string("\xe2\x86"), "\"" + r + "\"");                     // cut short at the end
  EXPECT_EQ(apps::json_string("\xf0\x9f\x98" "x"), "\"" + r + "x\"");            // cut short before 'x'
  // Valid UTF-8: 2, 3 and 4 bytes, kept.
  EXPECT_EQ(apps::json_string("\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80"), "\"\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80\"");
  // ASCII as before: quotes and backslashes escaped, control characters made spaces.
  EXPECT_EQ(apps::json_string("a\"b\\c\nd\te"), "\"a\\\"b\\\\c d e\"");
  EXPECT_EQ(apps::json_string(""), "\"\"");
}

// The whole file, with such a path in it: the "data" value is the path with U+FFFD.
TEST(MetricsJson, FileWithANonUtf8PathIsUtf8) {
  TempDir dir;
  Rng rng(1);
  Sequential model = Sequential::mnist_cnn(rng);
  apps::RunInfo info{Device::kCpu, false, 64, 1, "cpu \xfe", "dat\xff", 1, true};
  History h;
  EpochLog e;
  e.loss = 0.5, e.accuracy = 0.9, e.val_loss = e.val_accuracy = std::nan("");
  e.steps = 1;
  h.epochs.push_back(e);
  const std::string path = dir.file("m.json");
  apps::write_metrics_json(path, info, h, EvalResult{0.4, 0.91, 10}, model);
  const std::string j = io::read_file_bytes(path);
  EXPECT_NE(j.find("\"data\": \"dat\xef\xbf\xbd\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"hardware\": \"cpu \xef\xbf\xbd\""), std::string::npos) << j;
  EXPECT_EQ(j.find('\xff'), std::string::npos);
  EXPECT_EQ(j.find('\xfe'), std::string::npos);
}

// ---- output paths ----

// check_output_path runs before training so that a path the save would refuse is refused
// up front; it must agree with write_bytes_atomic on every kind of path, symlinks included
// (a symlink to a missing file used to pass, and the save failed after the first epoch).
// Both judge a path by output_target.
TEST(OutputPath, RefusedUpFrontExactlyWhenTheWriteWouldFail) {
  TempDir dir;
  const auto p = [&](const std::string& name) { return dir.file(name); };
  fs::create_directory(p("folder"));
  { std::ofstream(p("file.txt")) << "old"; }
  { std::ofstream(p("folder/inner.txt")) << "old"; }
  fs::create_symlink("/nonexistent/dir/x.ckpt", p("to_missing_folder.ckpt"));
  fs::create_symlink(p("folder/missing.ckpt"), p("to_missing_file.ckpt"));
  fs::create_symlink(p("folder/inner.txt"), p("to_file.txt"));
  fs::create_symlink(p("to_file.txt"), p("to_link.txt"));  // a chain of two
  fs::create_symlink(p("folder"), p("to_folder"));
  fs::create_symlink(p("loop_b"), p("loop_a"));
  fs::create_symlink(p("loop_a"), p("loop_b"));
  struct Case {
    std::string path;
    bool writable;
    std::string error;  // check_output_path's message after "--save PATH: ", when refused
  };
  const std::vector<Case> cases = {
      {p("new.ckpt"), true, ""},
      {p("file.txt"), true, ""},
      {p("to_file.txt"), true, ""},
      {p("to_link.txt"), true, ""},
      {"/dev/null", true, ""},
      {p("to_missing_folder.ckpt"), false, "is a symlink to a missing file (/nonexistent/dir/x.ckpt)"},
      {p("to_missing_file.ckpt"), false, "is a symlink to a missing file (" + p("folder/missing.ckpt") + ")"},
      {p("loop_a"), false, "is a symlink loop (" + p("loop_b") + ")"},
      {p("to_folder"), false, "is a folder, not a file"},
      {p("folder"), false, "is a folder, not a file"},
      {p("no/such/folder/x.ckpt"), false, "folder " + p("no/such/folder") + " does not exist or is not writable"},
      {p("file.txt/x.ckpt"), false, p("file.txt") + " is a file, not a folder"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    std::string error;
    try {
      apps::check_output_path("save", c.path);
    } catch (const std::invalid_argument& e) {
      error = e.what();
    }
    bool written = true;
    try {
      io::write_bytes_atomic(c.path, "new", 3);
    } catch (const std::runtime_error&) {
      written = false;
    }
    EXPECT_EQ(written, c.writable) << "the writer";
    EXPECT_EQ(error.empty(), written) << "check_output_path disagrees with the writer: " << error;
    if (!c.error.empty()) {
      EXPECT_EQ(error, "--save " + c.path + ": " + c.error);
    }
  }
  // The writes went through the links, which are still links.
  EXPECT_TRUE(fs::is_symlink(p("to_file.txt")));
  EXPECT_EQ(io::read_file_bytes(p("folder/inner.txt")), "new");
}

// A symlink is written in the folder of its target: that folder must be writable, not
// the link's. (Root may write anywhere, so the read-only folder only counts for others.)
TEST(OutputPath, ASymlinkIsCheckedInItsTargetsFolder) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: every folder is writable";
  TempDir dir;
  fs::create_directory(dir.file("ro"));
  { std::ofstream(dir.file("ro/run.ckpt")) << "old"; }
  fs::permissions(dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  fs::create_symlink(dir.file("ro/run.ckpt"), dir.file("link.ckpt"));
  std::string error;
  try {
    apps::check_output_path("save", dir.file("link.ckpt"));
  } catch (const std::invalid_argument& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "--save " + dir.file("link.ckpt") + ": folder " + dir.file("ro") +
                       " (where the symlink points) does not exist or is not writable");
  EXPECT_THROW(io::write_bytes_atomic(dir.file("link.ckpt"), "x", 1), std::runtime_error);
  fs::permissions(dir.file("ro"), fs::perms::owner_all);
}

// The live progress line fits the terminal: a line wider than the window wraps, and each
// '\r' then returns to its last row only, leaving a row behind per update (the full line is
// 84 characters, wider than the usual 80 columns). It clears a longer earlier line with
// spaces, not with an escape sequence that TERM=dumb shows as it is.
TEST(ProgressPrinter, LiveLineFitsTheTerminalWithoutEscapes) {
  const char* old = std::getenv("COLUMNS");
  const std::string saved = old ? old : "";
  for (const int columns : {1, 40, 80}) {
    SCOPED_TRACE("COLUMNS=" + std::to_string(columns));
    ::setenv("COLUMNS", std::to_string(columns).c_str(), 1);  // a file has no window size
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    {
      apps::ProgressPrinter progress(f, /*live=*/true, /*epochs=*/5);
      progress.update({0, 1, 750, 2.3026, 0.1, 0.01});
      progress.update({0, 375, 750, 0.2062, 0.9366, 1.5});
      EpochLog e;
      e.steps = 750;
      e.samples = 48000;
      e.loss = 0.2062, e.accuracy = 0.9366, e.val_loss = 0.0737, e.val_accuracy = 0.9761, e.train_seconds = 3;
      e.loss_scale = 1.0;
      progress.epoch_end(e);
    }
    std::rewind(f);
    std::string text;
    for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
    std::fclose(f);
    EXPECT_EQ(text.find('\033'), std::string::npos) << text;
    ASSERT_EQ(text.rfind("Epoch 1/5\n\r", 0), 0u) << text;
    // The live lines: between the header and the epoch's final line.
    const std::size_t last = text.rfind('\r');
    std::size_t at = text.find('\r');
    for (std::size_t next; at < last; at = next) {
      next = text.find('\r', at + 1);
      EXPECT_LE(next - at - 1, static_cast<std::size_t>(std::max(columns - 1, 0))) << text.substr(at + 1, next - at - 1);
    }
    if (columns > 10) {
      EXPECT_NE(text.find("\r375/750 ["), std::string::npos) << text;
    }
    EXPECT_NE(text.find("750/750 [==============================] - 3s 4ms/step - loss: 0.2062 - accuracy: 0.9366 - "
                        "val_loss: 0.0737 - val_accuracy: 0.9761\n"),
              std::string::npos)
        << text;
  }
  if (old) ::setenv("COLUMNS", saved.c_str(), 1);
  else ::unsetenv("COLUMNS");
}
