// cuda_fp16.h for the CPU emulation: kernels/*.cu include <cuda_fp16.h> first, and find
// this one, which brings the whole emulated subset of CUDA (cuda_emulator.h).
#pragma once
#include "test/emulator/cuda_emulator.h"
