// Runs the shipped kernels/affine.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/affine_emulation.rs.
//
// stdin, little-endian: "AFFEMU01", then u32 kernel (0 qmv, 1 dequant, 2 qmv_swiglu), value_type (qmv: InT,
// dequant: OutT; 0 f32, 1 f16, 2 bf16), scale_type (same codes), experts E, rows R, cols K,
// bits, group_size, out_rows M, x_div, has_ids, x_rows X; then packed u32 [E*R, K*bits/32],
// f32 scales and biases [E*R, K/group_size], for qmv f32 x [X, K], and when has_ids u32 ids
// [M]. Inputs are converted to the instantiation's InT / ScT here (exactly, when the caller
// already rounded them).
// stdout: f32 [M, R] (qmv), [M, R/2] (qmv_swiglu) or [M, K] (dequant). qmv_swiglu is read
// like qmv (it takes the same inputs).
//
// The launch geometry and the AffineParams the host passes are reproduced here; they must
// match crates/gdn-ops/src/metal/affine.rs (QMV_ROWS_PER_SIMDGROUP = 4, QMV_SIMDGROUPS = 2,
// DEQUANT_THREADS = 64, DEQUANT_VALUES_PER_THREAD = 8; params.rows is R for qmv, E*R for
// dequant). Change both together.
//
// Memory checks: every buffer has guard elements (a NaN bit pattern) on both sides and an
// inaccessible page right after its end (inputs) or after its trailing guard (outputs).
// Inputs are read-only: a write to one faults. A read past an input's end faults, a read
// before it poisons the result with NaN, a write outside an output changes its guards, and
// outputs start poisoned with a different NaN pattern that must be gone from every element.
// Exit status 2: bad input; 3: a guard or an output element is wrong; 4: a memory fault.
//
// Build: clang++-19 -std=c++17 -O2 -ffp-contract=off --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/affine_harness.cpp -o affine_harness
// (-ffp-contract=off: the dequant check is bit for bit against the reference's separate
// multiply and add.)

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../affine.metal"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "affine_harness: %s\n", what);
  std::exit(2);
}

// Elements of guard on either side of every buffer.
constexpr std::size_t kGuard = 256;

// Bit patterns, each a NaN of its type (the pattern of u32 words is only distinctive): guards
// around buffers, and the poison outputs start with. Neither is what a conversion produces.
template <class T>
struct Pattern;
template <>
struct Pattern<float> {
  static constexpr std::uint32_t guard = 0x7FA1A1A1u, poison = 0x7F80BEEFu;
};
template <>
struct Pattern<uint> {
  static constexpr std::uint32_t guard = 0x7FA1A1A1u, poison = 0x7F80BEEFu;
};
template <>
struct Pattern<half> {
  static constexpr std::uint16_t guard = 0x7D5Au, poison = 0x7CEEu;
};
template <>
struct Pattern<bfloat> {
  static constexpr std::uint16_t guard = 0x7FA1u, poison = 0x7FEEu;
};

template <class T, class Bits>
T from_bits(Bits b) {
  static_assert(sizeof(T) == sizeof(Bits), "pattern width");
  T t;
  std::memcpy(&t, &b, sizeof(T));
  return t;
}

template <class T>
bool is_pattern(const T& v, decltype(Pattern<T>::guard) bits) {
  return std::memcmp(&v, &bits, sizeof(T)) == 0;
}

// Every mapping, for the fault handler's message.
struct Mapping {
  const char* name;
  std::uintptr_t begin, end;
};
Mapping g_maps[8];
int g_map_count = 0;

void on_fault(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const char* what = "unknown memory";
  for (int i = 0; i < g_map_count; ++i) {
    if (at >= g_maps[i].begin && at < g_maps[i].end) what = g_maps[i].name;
  }
  char msg[160];
  const int n = std::snprintf(msg, sizeof msg, "affine_harness: %s at an address of %s (read past its end, or a write)\n",
                              sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", what);
  if (n > 0) {
    ssize_t ignored = write(2, msg, std::size_t(n));
    (void)ignored;
  }
  _exit(4);
}

// count elements of T: [guard][data][guard, outputs only][page, no access]; the data of an
// input ends exactly at the inaccessible page.
template <class T>
class Guarded {
 public:
  Guarded(const char* name, std::size_t count, bool output) : name_(name), n_(count), output_(output) {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = (kGuard + count + (output ? kGuard : 0)) * sizeof(T);
    body_ = (bytes + page - 1) / page * page;
    void* m = mmap(nullptr, body_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap failed");
    base_ = static_cast<char*>(m);
    if (mprotect(base_ + body_, page, PROT_NONE) != 0) die("mprotect failed");
    T* end = reinterpret_cast<T*>(base_ + body_) - (output ? kGuard : 0);
    data_ = end - count;
    lo_ = data_ - kGuard;
    const T guard = from_bits<T>(Pattern<T>::guard);
    for (T* p = reinterpret_cast<T*>(base_); p < data_; ++p) *p = guard;
    if (output) {
      for (std::size_t i = 0; i < count; ++i) data_[i] = from_bits<T>(Pattern<T>::poison);
      for (std::size_t i = 0; i < kGuard; ++i) end[i] = guard;
    }
    if (g_map_count < 8) g_maps[g_map_count++] = Mapping{name, std::uintptr_t(base_), std::uintptr_t(base_ + body_ + page)};
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, body_ + std::size_t(sysconf(_SC_PAGESIZE))); }

  T* data() { return data_; }
  std::size_t size() const { return n_; }

  // Inputs: filled, then read-only for the run.
  void seal() {
    if (mprotect(base_, body_, PROT_READ) != 0) die("mprotect failed");
  }

  void check() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (!is_pattern(lo_[i], Pattern<T>::guard) || (output_ && !is_pattern(data_[n_ + i], Pattern<T>::guard))) {
        std::fprintf(stderr, "affine_harness: write outside %s\n", name_);
        std::exit(3);
      }
    }
    if (!output_) return;
    for (std::size_t i = 0; i < n_; ++i) {
      if (is_pattern(data_[i], Pattern<T>::poison)) {
        std::fprintf(stderr, "affine_harness: %s[%zu] was never written\n", name_, i);
        std::exit(3);
      }
    }
  }

 private:
  const char* name_;
  std::size_t n_;
  bool output_;
  std::size_t body_ = 0;
  char* base_ = nullptr;
  T* data_ = nullptr;
  T* lo_ = nullptr;
};

template <class Raw>
std::vector<Raw> read_raw(std::size_t n) {
  std::vector<Raw> out(n);
  if (n != 0 && std::fread(out.data(), sizeof(Raw), n, stdin) != n) die("short input");
  return out;
}

// A sealed input buffer holding src converted to T.
template <class T, class Raw>
void fill(Guarded<T>& dst, const std::vector<Raw>& src) {
  for (std::size_t i = 0; i < src.size(); ++i) dst.data()[i] = static_cast<T>(src[i]);
  dst.seal();
}

template <class T>
void write_f32(Guarded<T>& buf) {
  std::vector<float> out(buf.size());
  for (std::size_t i = 0; i < buf.size(); ++i) out[i] = static_cast<float>(buf.data()[i]);
  if (!out.empty() && std::fwrite(out.data(), sizeof(float), out.size(), stdout) != out.size()) die("short write");
}

struct Case {
  uint kernel, experts, rows, cols, bits, group_size, out_rows, x_div, has_ids, x_rows;
  std::vector<std::uint32_t> packed, ids;
  std::vector<float> scales, biases, x;
};

// The signatures every affine_qmv_{in}_{sc} / affine_dequant_{out}_{sc} kernel must have for
// its types: a kernel named for other types does not convert to it, and fails to compile.
template <class InT, class ScT>
using QmvKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device InT*,
                           const device uint*, device InT*, constant AffineParams&, uint3, uint, uint);
template <class OutT, class ScT>
using DequantKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device uint*,
                               device OutT*, constant AffineParams&, uint3);

// Mirrors QMV_ROWS_PER_SIMDGROUP and QMV_SIMDGROUPS, DEQUANT_THREADS and
// DEQUANT_VALUES_PER_THREAD of crates/gdn-ops/src/metal/affine.rs.
constexpr uint kQmvRowsPerSimdgroup = 4;
constexpr uint kQmvSimdgroups = 2;
constexpr uint kDequantThreads = 64;
constexpr uint kDequantValuesPerThread = 8;

// swiglu: affine_qmv_swiglu_*, whose y holds R/2 activations per output row.
template <class InT, class ScT>
void run_qmv(const Case& c, QmvKernel<InT, ScT> kernel, bool swiglu) {
  const uint y_cols = swiglu ? c.rows / 2 : c.rows;
  Guarded<uint> w("w", c.packed.size(), false);
  Guarded<ScT> scales("scales", c.scales.size(), false);
  Guarded<ScT> biases("biases", c.biases.size(), false);
  Guarded<InT> x("x", c.x.size(), false);
  Guarded<uint> ids("ids", c.ids.size(), false);
  Guarded<InT> y("y", std::size_t(c.out_rows) * y_cols, true);
  fill(w, c.packed);
  fill(scales, c.scales);
  fill(biases, c.biases);
  fill(x, c.x);
  fill(ids, c.ids);
  // Host: params(m, m.rows, out_rows, x_div, ids.is_some()).
  const AffineParams params{c.rows, c.cols, c.bits, c.group_size, c.out_rows, c.x_div, c.has_ids};

  const uint rows_per_group = kQmvRowsPerSimdgroup * kQmvSimdgroups;
  const uint3 groups{(y_cols + rows_per_group - 1) / rows_per_group, c.out_rows, 1};
  const uint3 per_group{32, kQmvSimdgroups, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
           (const device InT*)x.data(),
           // Unbound without ids: a read would fault.
           c.has_ids != 0 ? (const device uint*)ids.data() : nullptr, (device InT*)y.data(),
           *(constant AffineParams*)&params, id.threadgroup_position_in_grid, id.simdgroup_index_in_threadgroup,
           id.thread_index_in_simdgroup);
  });

  w.check();
  scales.check();
  biases.check();
  x.check();
  ids.check();
  y.check();
  write_f32(y);
}

template <class OutT, class ScT>
void run_dequant(const Case& c, DequantKernel<OutT, ScT> kernel) {
  Guarded<uint> w("w", c.packed.size(), false);
  Guarded<ScT> scales("scales", c.scales.size(), false);
  Guarded<ScT> biases("biases", c.biases.size(), false);
  Guarded<uint> ids("ids", c.ids.size(), false);
  Guarded<OutT> out("out", std::size_t(c.out_rows) * c.cols, true);
  fill(w, c.packed);
  fill(scales, c.scales);
  fill(biases, c.biases);
  fill(ids, c.ids);
  // Host: params(m, m.experts * m.rows, count, 1, ids.is_some()).
  const AffineParams params{c.experts * c.rows, c.cols, c.bits, c.group_size, c.out_rows, 1, c.has_ids};

  const uint per_group_values = kDequantThreads * kDequantValuesPerThread;
  const uint3 groups{(c.cols + per_group_values - 1) / per_group_values, c.out_rows, 1};
  const uint3 per_group{kDequantThreads, 1, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
           c.has_ids != 0 ? (const device uint*)ids.data() : nullptr, (device OutT*)out.data(),
           *(constant AffineParams*)&params, id.thread_position_in_grid);
  });

  w.check();
  scales.check();
  biases.check();
  ids.check();
  out.check();
  write_f32(out);
}

}  // namespace

int main() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);

  char magic[8];
  if (std::fread(magic, 1, 8, stdin) != 8 || std::memcmp(magic, "AFFEMU01", 8) != 0) die("bad magic");
  std::uint32_t h[12];
  if (std::fread(h, sizeof(std::uint32_t), 12, stdin) != 12) die("short header");
  Case c;
  const std::uint32_t value_type = h[1], scale_type = h[2];
  c.kernel = h[0];
  c.experts = h[3];
  c.rows = h[4];
  c.cols = h[5];
  c.bits = h[6];
  c.group_size = h[7];
  c.out_rows = h[8];
  c.x_div = h[9];
  c.has_ids = h[10];
  c.x_rows = h[11];

  // The host side's contract (crates/gdn-ops/src/affine_tensor.rs checks it).
  const bool bits_ok = c.bits == 2 || c.bits == 3 || c.bits == 4 || c.bits == 5 || c.bits == 6 || c.bits == 8;
  if (!bits_ok) die("bits must be 2, 3, 4, 5, 6 or 8");
  if (c.group_size == 0 || c.group_size % 8 != 0 || c.cols % c.group_size != 0) die("cols must be a multiple of group_size, itself a multiple of 8");
  if (c.kernel > 2) die("unknown kernel");
  if (c.kernel == 2 && c.rows % 2 != 0) die("swiglu: rows must be even (gate rows, then up rows)");
  if (c.has_ids > 1) die("has_ids must be 0 or 1");
  const std::size_t stacked = std::size_t(c.experts) * c.rows;
  c.packed = read_raw<std::uint32_t>(stacked * c.cols * c.bits / 32);
  c.scales = read_raw<float>(stacked * (c.cols / c.group_size));
  c.biases = read_raw<float>(stacked * (c.cols / c.group_size));
  if (c.kernel != 1) {
    if (c.x_div == 0 || c.out_rows == 0 || (c.out_rows - 1) / c.x_div >= c.x_rows) die("qmv: x has too few rows");
    c.x = read_raw<float>(std::size_t(c.x_rows) * c.cols);
  } else if (c.x_rows != 0 || c.x_div != 1) {
    die("dequant takes no x (x_rows 0, x_div 1)");
  }
  c.ids = read_raw<std::uint32_t>(c.has_ids != 0 ? c.out_rows : 0);
  if (c.kernel != 1) {
    // The qmv kernel does not know E, so it cannot check: ids come from the router's top-k.
    for (std::uint32_t e : c.ids) {
      if (e >= c.experts) die("qmv: expert id out of range");
    }
    if (c.has_ids == 0 && c.experts != 1) die("qmv without ids uses expert 0: pass experts = 1");
  }
  if (std::fgetc(stdin) != EOF) die("trailing input");

  const std::uint32_t which = value_type * 3 + scale_type;
  if (value_type > 2 || scale_type > 2) die("unknown value_type / scale_type");
  if (c.kernel == 0) {
    switch (which) {
      case 0: run_qmv<float, float>(c, affine_qmv_f32_f32, false); break;
      case 1: run_qmv<float, half>(c, affine_qmv_f32_f16, false); break;
      case 2: run_qmv<float, bfloat>(c, affine_qmv_f32_bf16, false); break;
      case 3: run_qmv<half, float>(c, affine_qmv_f16_f32, false); break;
      case 4: run_qmv<half, half>(c, affine_qmv_f16_f16, false); break;
      case 5: run_qmv<half, bfloat>(c, affine_qmv_f16_bf16, false); break;
      case 6: run_qmv<bfloat, float>(c, affine_qmv_bf16_f32, false); break;
      case 7: run_qmv<bfloat, half>(c, affine_qmv_bf16_f16, false); break;
      case 8: run_qmv<bfloat, bfloat>(c, affine_qmv_bf16_bf16, false); break;
    }
  } else if (c.kernel == 2) {
    switch (which) {
      case 0: run_qmv<float, float>(c, affine_qmv_swiglu_f32_f32, true); break;
      case 1: run_qmv<float, half>(c, affine_qmv_swiglu_f32_f16, true); break;
      case 2: run_qmv<float, bfloat>(c, affine_qmv_swiglu_f32_bf16, true); break;
      case 3: run_qmv<half, float>(c, affine_qmv_swiglu_f16_f32, true); break;
      case 4: run_qmv<half, half>(c, affine_qmv_swiglu_f16_f16, true); break;
      case 5: run_qmv<half, bfloat>(c, affine_qmv_swiglu_f16_bf16, true); break;
      case 6: run_qmv<bfloat, float>(c, affine_qmv_swiglu_bf16_f32, true); break;
      case 7: run_qmv<bfloat, half>(c, affine_qmv_swiglu_bf16_f16, true); break;
      case 8: run_qmv<bfloat, bfloat>(c, affine_qmv_swiglu_bf16_bf16, true); break;
    }
  } else {
    switch (which) {
      case 0: run_dequant<float, float>(c, affine_dequant_f32_f32); break;
      case 1: run_dequant<float, half>(c, affine_dequant_f32_f16); break;
      case 2: run_dequant<float, bfloat>(c, affine_dequant_f32_bf16); break;
      case 3: run_dequant<half, float>(c, affine_dequant_f16_f32); break;
      case 4: run_dequant<half, half>(c, affine_dequant_f16_f16); break;
      case 5: run_dequant<half, bfloat>(c, affine_dequant_f16_bf16); break;
      case 6: run_dequant<bfloat, float>(c, affine_dequant_bf16_f32); break;
      case 7: run_dequant<bfloat, half>(c, affine_dequant_bf16_f16); break;
      case 8: run_dequant<bfloat, bfloat>(c, affine_dequant_bf16_bf16); break;
    }
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
