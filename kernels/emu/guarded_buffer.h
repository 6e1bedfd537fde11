// Guarded buffers and stdin/stdout plumbing for the emulation harnesses of the fused decode
// kernels (add_rms_norm, attn_prep, attn_decode, gdn_conv_prep, gated_rms_norm,
// gated_delta_norm, moe_route, moe_combine): what kernels/emu/affine_harness.cpp does inline,
// shared.
//
// Every buffer has guard elements (a NaN bit pattern) on both sides and an inaccessible page
// right after its end (inputs) or after its trailing guard (outputs). Inputs are read-only
// during the run: a write to one faults. A read past an input's end faults, a read before it
// poisons the result with NaN, a write outside an output changes its guards, and outputs
// start poisoned with a different NaN pattern that must be gone from every element the
// kernel owns. In-place buffers (a KV cache) are outputs filled with data before the run.
// Exit status 2: bad input; 3: a guard or an output element is wrong; 4: a memory fault.
//
// Include it first: it includes the system headers it needs, then the emulated
// <metal_stdlib> (whose macros must come after every system header).
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <metal_stdlib>

namespace guarded {

inline const char* g_harness = "harness";

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "%s: %s\n", g_harness, what);
  std::exit(2);
}

// Elements of guard on either side of every buffer.
constexpr std::size_t kGuard = 256;

// Bit patterns, each a NaN of its type: guards around buffers, and the poison outputs start
// with. Neither is what a conversion produces.
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
inline Mapping g_maps[32];
inline int g_map_count = 0;

inline void on_fault(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const char* what = "unknown memory";
  for (int i = 0; i < g_map_count; ++i) {
    if (at >= g_maps[i].begin && at < g_maps[i].end) what = g_maps[i].name;
  }
  char msg[200];
  const int n = std::snprintf(msg, sizeof msg, "%s: %s at an address of %s (read past its end, or a write)\n",
                              g_harness, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", what);
  if (n > 0) {
    ssize_t ignored = write(2, msg, std::size_t(n));
    (void)ignored;
  }
  _exit(4);
}

inline void install_fault_handler(const char* harness) {
  g_harness = harness;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

enum class Kind { kInput, kOutput, kInPlace };

// count elements of T: [guard][data][guard, outputs only][page, no access].
template <class T>
class Buffer {
 public:
  Buffer(const char* name, std::size_t count, Kind kind) : name_(name), n_(count), kind_(kind) {
    const bool output = kind != Kind::kInput;
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
    if (g_map_count < 32) g_maps[g_map_count++] = Mapping{name, std::uintptr_t(base_), std::uintptr_t(base_ + body_ + page)};
  }
  // An input or in-place buffer holding values converted to T (an input becomes read-only).
  template <class Raw>
  Buffer(const char* name, const std::vector<Raw>& values, Kind kind) : Buffer(name, values.size(), kind) {
    if (kind == Kind::kOutput) die("an output starts poisoned, not filled");
    fill(values);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { munmap(base_, body_ + std::size_t(sysconf(_SC_PAGESIZE))); }

  T* data() { return data_; }
  std::size_t size() const { return n_; }

  // Fills the buffer with src converted to T; an input becomes read-only.
  template <class Raw>
  void fill(const std::vector<Raw>& src) {
    if (src.size() != n_) die("fill: wrong length");
    for (std::size_t i = 0; i < n_; ++i) data_[i] = static_cast<T>(src[i]);
    if (kind_ == Kind::kInput && mprotect(base_, body_, PROT_READ) != 0) die("mprotect failed");
  }

  // Guards intact; for outputs, every element written (in-place buffers start filled).
  void check() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      const bool hi_bad = kind_ != Kind::kInput && !is_pattern(data_[n_ + i], Pattern<T>::guard);
      if (!is_pattern(lo_[i], Pattern<T>::guard) || hi_bad) {
        std::fprintf(stderr, "%s: write outside %s\n", g_harness, name_);
        std::exit(3);
      }
    }
    if (kind_ != Kind::kOutput) return;
    for (std::size_t i = 0; i < n_; ++i) {
      if (is_pattern(data_[i], Pattern<T>::poison)) {
        std::fprintf(stderr, "%s: %s[%zu] was never written\n", g_harness, name_, i);
        std::exit(3);
      }
    }
  }

  // The values as f32 on stdout.
  void write_f32() const {
    std::vector<float> out(n_);
    for (std::size_t i = 0; i < n_; ++i) out[i] = static_cast<float>(data_[i]);
    if (!out.empty() && std::fwrite(out.data(), sizeof(float), out.size(), stdout) != out.size()) die("short write");
  }

  // A u32 buffer's raw words on stdout (read back as f32 bit patterns).
  void write_words() const {
    static_assert(sizeof(T) == sizeof(std::uint32_t), "32-bit words");
    if (n_ != 0 && std::fwrite(data_, sizeof(T), n_, stdout) != n_) die("short write");
  }

 private:
  const char* name_;
  std::size_t n_;
  Kind kind_;
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

inline void expect_magic(const char* magic) {
  char got[8];
  if (std::fread(got, 1, 8, stdin) != 8 || std::memcmp(got, magic, 8) != 0) die("bad magic");
}

// The 8-byte magic, then N u32 header words.
template <std::size_t N>
void read_header(const char (&magic)[9], std::uint32_t (&h)[N]) {
  expect_magic(magic);
  if (std::fread(h, sizeof(std::uint32_t), N, stdin) != N) die("short header");
}

inline void expect_end() {
  if (std::fgetc(stdin) != EOF) die("trailing input");
}

// One f32 header word after the u32 ones (an epsilon, a scale).
inline float read_f32_word() {
  float x;
  if (std::fread(&x, sizeof(float), 1, stdin) != 1) die("short header");
  return x;
}

// Checks each buffer after a run, in order ([Buffer::check]: its guards, and an output's
// poison).
template <class... Buffers>
void check_all(const Buffers&... buffers) {
  (buffers.check(), ...);
}

// A type as a value, for the dispatch on a wire code below.
template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the float type of wire code `code`: 0 f32, 1 F16, 2 BF16 (the
// emulated language's half types); dies with `what` on any other code.
template <class F16, class BF16, class F>
void with_float_type(std::uint32_t code, const char* what, F&& f) {
  switch (code) {
    case 0: f(TypeTag<float>{}); break;
    case 1: f(TypeTag<F16>{}); break;
    case 2: f(TypeTag<BF16>{}); break;
    default: die(what);
  }
}

// The harness's exit status once its results are written: 0, or 1 when stdout failed.
inline int finish() { return std::fflush(stdout) == 0 ? 0 : 1; }

}  // namespace guarded
