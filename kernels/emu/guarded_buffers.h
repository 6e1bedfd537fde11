// Guarded buffers and input/output plumbing shared by the emulation harnesses of the MoE
// kernels (moe_route_harness.cpp, moe_combine_harness.cpp): the same memory checks as
// affine_harness.cpp.
//
// Every buffer has guard elements (a NaN bit pattern) on both sides and an inaccessible page
// right after its end (inputs) or after its trailing guard (outputs). Inputs are read-only:
// a write to one faults. A read past an input's end faults, a read before it poisons the
// result with NaN, a write outside an output changes its guards, and outputs start poisoned
// with a different NaN pattern that must be gone from every element.
// Exit status 2: bad input; 3: a guard or an output element is wrong; 4: a memory fault.
//
// Include after metal_emu.h (the element types) and define HARNESS_NAME (a string) first.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace guarded {

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, HARNESS_NAME ": %s\n", what);
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
inline Mapping g_maps[16];
inline int g_map_count = 0;

inline void on_fault(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const char* what = "unknown memory";
  for (int i = 0; i < g_map_count; ++i) {
    if (at >= g_maps[i].begin && at < g_maps[i].end) what = g_maps[i].name;
  }
  char msg[160];
  const int n = std::snprintf(msg, sizeof msg, HARNESS_NAME ": %s at an address of %s (read past its end, or a write)\n",
                              sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", what);
  if (n > 0) {
    ssize_t ignored = write(2, msg, std::size_t(n));
    (void)ignored;
  }
  _exit(4);
}

inline void install_fault_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
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
    if (g_map_count < 16) g_maps[g_map_count++] = Mapping{name, std::uintptr_t(base_), std::uintptr_t(base_ + body_ + page)};
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
        std::fprintf(stderr, HARNESS_NAME ": write outside %s\n", name_);
        std::exit(3);
      }
    }
    if (!output_) return;
    for (std::size_t i = 0; i < n_; ++i) {
      if (is_pattern(data_[i], Pattern<T>::poison)) {
        std::fprintf(stderr, HARNESS_NAME ": %s[%zu] was never written\n", name_, i);
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

// An output's values as f32 on stdout.
template <class T>
void write_f32(Guarded<T>& buf) {
  std::vector<float> out(buf.size());
  for (std::size_t i = 0; i < buf.size(); ++i) out[i] = static_cast<float>(buf.data()[i]);
  if (!out.empty() && std::fwrite(out.data(), sizeof(float), out.size(), stdout) != out.size()) die("short write");
}

// A u32 output's raw words on stdout (read back as f32 bit patterns).
inline void write_words(Guarded<uint>& buf) {
  if (buf.size() != 0 && std::fwrite(buf.data(), sizeof(uint), buf.size(), stdout) != buf.size()) die("short write");
}

}  // namespace guarded
