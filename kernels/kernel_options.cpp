// kernel_options.cpp: the rungs' names and which device has which.
#include "kernels/kernel_options.h"

#include <stdexcept>

namespace mf {

const char* rung_name(KernelRung rung) {
  switch (rung) {
    case KernelRung::kNaive: return "naive";
    case KernelRung::kLibrary: return "library";
    case KernelRung::kTuned: return "tuned";
    case KernelRung::kFused: return "fused";
    case KernelRung::kDefault: break;
  }
  return "default";
}

bool parse_rung(const std::string& text, KernelRung& rung) {
  for (KernelRung r : {KernelRung::kNaive, KernelRung::kLibrary, KernelRung::kTuned, KernelRung::kFused})
    if (text == rung_name(r)) return rung = r, true;
  return false;
}

KernelRung resolve_rung(KernelRung rung, Device device) {
  if (rung != KernelRung::kDefault) return rung;
  return device == Device::kGpu ? KernelRung::kLibrary : KernelRung::kTuned;
}

std::string rung_unavailable(KernelRung rung, Device device) {
  const KernelRung r = resolve_rung(rung, device);
  if (device == Device::kCpu && r == KernelRung::kFused)
    return "the rung 'fused' is the GPU's (a fused training step); the CPU has naive, library and tuned";
  if (device == Device::kGpu && r == KernelRung::kTuned)
    return "the rung 'tuned' is the CPU's (register tiles, AVX-512); the GPU has naive, library and fused";
  return "";
}

KernelRung require_rung(KernelRung rung, Device device, const std::string& who) {
  const std::string why = rung_unavailable(rung, device);
  if (!why.empty()) throw std::invalid_argument(who + ": " + why);
  return resolve_rung(rung, device);
}

}  // namespace mf
