// fake_cublas.cpp: the cuBLAS calls microflow makes, on the CPU, for the emulated GPU tests.
// Compiled against the real <cublas_v2.h> and linked instead of libcublas (see fake_cudart.cpp).
//
// What it emulates: handles (stream, math mode, workspace), and column-major GEMM in f32 and
// f16 with f32 scaling factors, validated as cuBLAS documents (dimensions, leading
// dimensions, operations, type and compute-type combinations). The work is queued on the
// handle's stream (streams.h), so it runs inside a captured CUDA graph as it would on a GPU.
// Every product is accumulated in double and rounded once to the output type, so the
// results are as exact as the output type allows.
// Operands that run past their allocation or lie in host memory fail the call
// (CUBLAS_STATUS_EXECUTION_FAILED, with a line on stderr), where a GPU would read or write
// them anyway.
// What it does not: device pointer mode (alpha and beta are always read from the host),
// reduced-precision paths (TF32, FAST_16F, ...: computed exactly, like _PEDANTIC), half or
// double compute types, complex types, the batched and 64-bit-index calls, explicit
// CUBLAS_GEMM_ALGOn choices, and cuBLAS's own use of the workspace.
#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "tensor/half.h"
#include "test/emulator/streams.h"

struct cublasContext {
  cudaStream_t stream = nullptr;  // nullptr: the legacy default stream
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  void* workspace = nullptr;      // nullptr: cuBLAS's own pool
  std::size_t workspace_bytes = 0;
};

namespace {

// How an operand is stored: f32, or f16 read through mf::half_to_float.
enum class Storage { kF32, kF16 };

float load(const void* p, Storage s, std::int64_t i) {
  if (s == Storage::kF16) return mf::half_to_float(static_cast<const mf::Half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void store(void* p, Storage s, std::int64_t i, double v) {
  if (s == Storage::kF16)
    static_cast<mf::Half*>(p)[i] = mf::float_to_half(static_cast<float>(v));
  else
    static_cast<float*>(p)[i] = static_cast<float>(v);
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

// C (m x n, column-major, leading dimension ldc) = alpha op(A) op(B) + beta C, with op(A)
// m x k and op(B) k x n. For real types CUBLAS_OP_C is CUBLAS_OP_T. As in BLAS, C is not
// read when beta == 0 (it may hold anything, NaN included), and A and B are not read when
// alpha == 0 or k == 0 (C = beta C then).
struct Gemm {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  Storage sa = Storage::kF32, sb = Storage::kF32, sc = Storage::kF32;

  void run() const {
    const bool product = alpha != 0.0f && k > 0;
    // op(A) row by row and op(B) column by column, each as contiguous floats, so every
    // dot product below walks both operands with stride 1 whatever the transposes.
    std::vector<float> at(product ? static_cast<std::size_t>(m * k) : 0);
    std::vector<float> bt(product ? static_cast<std::size_t>(n * k) : 0);
    for (std::int64_t i = 0; product && i < m; ++i)
      for (std::int64_t l = 0; l < k; ++l)
        at[static_cast<std::size_t>(i * k + l)] = load(a, sa, trans_a ? l + i * lda : i + l * lda);
    for (std::int64_t j = 0; product && j < n; ++j)
      for (std::int64_t l = 0; l < k; ++l)
        bt[static_cast<std::size_t>(j * k + l)] = load(b, sb, trans_b ? j + l * ldb : l + j * ldb);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        double v = 0.0;
        if (product) {
          const float* ar = at.data() + i * k;
          const float* bc = bt.data() + j * k;
          double acc = 0.0;
          for (std::int64_t l = 0; l < k; ++l) acc += static_cast<double>(ar[l]) * bc[l];
          v = static_cast<double>(alpha) * acc;
        }
        if (beta != 0.0f) v += static_cast<double>(beta) * load(c, sc, i + j * ldc);
        store(c, sc, i + j * ldc, v);
      }
  }
};

// The checks cuBLAS makes of every GEMM, in its order: handle, operations, sizes, leading
// dimensions (those of the operands as stored, whatever op() makes of them).
cublasStatus_t check_gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                          int k, int lda, int ldb, int ldc, const void* alpha, const void* beta) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_op(transa) || !valid_op(transb)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
  if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// Bytes from the first to the last element of a column-major rows x cols operand with
// leading dimension ld; 0 when it has no element.
std::size_t span_bytes(std::int64_t rows, std::int64_t cols, std::int64_t ld, Storage s) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<std::size_t>((cols - 1) * ld + rows) * (s == Storage::kF16 ? 2 : 4);
}

// The operand (of "A", "B", "C") that does not lie inside one device allocation, or null.
// A and B are only checked when they are read (alpha != 0 and k > 0).
const char* operand_off_device(const Gemm& g) {
  const auto off = [](const void* p, std::size_t bytes) { return bytes > 0 && !mf::emulator::device_span(p, bytes); };
  if (g.alpha != 0.0f && g.k > 0) {
    if (off(g.a, span_bytes(g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.sa))) return "A";
    if (off(g.b, span_bytes(g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.sb))) return "B";
  }
  if (off(g.c, span_bytes(g.m, g.n, g.ldc, g.sc))) return "C";
  return nullptr;
}

cublasStatus_t enqueue_gemm(cublasHandle_t handle, const Gemm& g) {
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to write, nothing queued
  // cuBLAS itself does not check this: its kernel would run past the operand's allocation (or
  // into host memory) and fault or use whatever lies there, so the call fails here instead.
  if (const char* bad = operand_off_device(g)) {
    std::fprintf(stderr,
                 "emulated cuBLAS: GEMM operand %s (m %lld, n %lld, k %lld, lda %lld, ldb %lld, ldc %lld) is not "
                 "inside one device allocation\n",
                 bad, static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k),
                 static_cast<long long>(g.lda), static_cast<long long>(g.ldb), static_cast<long long>(g.ldc));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (!mf::emulator::enqueue(handle->stream, [g] { g.run(); })) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

Gemm make_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const float* alpha,
               const void* a, int lda, const void* b, int ldb, const float* beta, void* c, int ldc) {
  Gemm g;
  g.trans_a = transa != CUBLAS_OP_N;
  g.trans_b = transb != CUBLAS_OP_N;
  g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  // Host pointer mode: the scalars are read now, at the call, not when the work runs.
  g.alpha = *alpha;
  g.beta = *beta;
  g.a = a, g.b = b, g.c = c;
  return g;
}

}  // namespace

// extern "C", as the header declares them: a definition whose parameters differ from the
// declaration is then an error instead of a silent C++ overload.
extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// As in cuBLAS, setting the stream also drops a workspace given by cublasSetWorkspace (it
// reverts to cuBLAS's pool), so the workspace must be set after the stream.
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS requires the workspace to be aligned to 256 bytes (cudaMalloc's alignment).
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (!workspace && bytes > 0) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  // One base mode, optionally with the "no reduced-precision reduction" flag.
  const int base = static_cast<int>(mode) & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH:
      handle->math = mode;
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (!value) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  const cublasStatus_t s = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc, alpha, beta);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return enqueue_gemm(handle, make_gemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc));
}

// The combinations cuBLAS documents for these compute types: with CUBLAS_COMPUTE_32F and
// _PEDANTIC, f16 or f32 operands A and B of one type and C of that type or f32; with the
// _FAST_ variants, f32 only. All take f32 alpha and beta.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const cublasStatus_t s = check_gemm(handle, transa, transb, m, n, k, lda, ldb, ldc, alpha, beta);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  bool types_ok = false;
  switch (computeType) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      types_ok = (Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F) ||
                 (Atype == CUDA_R_16F && Btype == CUDA_R_16F && (Ctype == CUDA_R_16F || Ctype == CUDA_R_32F));
      break;
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      types_ok = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F;
      break;
    default:
      break;
  }
  if (!types_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g = make_gemm(transa, transb, m, n, k, static_cast<const float*>(alpha), A, lda, B, ldb,
                     static_cast<const float*>(beta), C, ldc);
  g.sa = Atype == CUDA_R_16F ? Storage::kF16 : Storage::kF32;
  g.sb = Btype == CUDA_R_16F ? Storage::kF16 : Storage::kF32;
  g.sc = Ctype == CUDA_R_16F ? Storage::kF16 : Storage::kF32;
  return enqueue_gemm(handle, g);
}

}  // extern "C"
