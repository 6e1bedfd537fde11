// Runs the shipped kernels/gated_delta.metal on the CPU through metal_emu.h.
//
// stdin: "GDNEMU01", then the case of gdn_case.h. Inputs are converted to the instantiation's
// InT / StT here (exactly, when the caller already rounded them).
// stdout: f32 arrays y [B,T,Hv,Dv] and the final state [B,Hv,Dv,Dk].
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/gated_delta_harness.cpp -o gated_delta_harness

#include "gdn_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "../gated_delta.metal"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "gated_delta_harness: %s\n", what);
  std::exit(2);
}

// Elements of NaN on both sides of every buffer: a stray read poisons the result, a stray
// write changes the guard.
constexpr std::size_t kGuard = 1024;

template <class T>
struct Guarded {
  std::vector<T> mem;
  std::size_t n;
  explicit Guarded(std::size_t count) : mem(count + 2 * kGuard, nan()), n(count) {}
  static T nan() { return T(std::numeric_limits<float>::quiet_NaN()); }
  T* data() { return mem.data() + kGuard; }
  void check_guards(const char* name) const {
    const T pattern = nan();
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (std::memcmp(&mem[i], &pattern, sizeof(T)) != 0 ||
          std::memcmp(&mem[kGuard + n + i], &pattern, sizeof(T)) != 0) {
        std::fprintf(stderr, "gated_delta_harness: write outside %s\n", name);
        std::exit(3);
      }
    }
  }
};

template <class T>
Guarded<T> convert(const std::vector<float>& src) {
  Guarded<T> out(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) out.data()[i] = static_cast<T>(src[i]);
  return out;
}

template <class T>
void write_f32(const Guarded<T>& buf) {
  std::vector<float> out(buf.n);
  for (std::size_t i = 0; i < buf.n; ++i) out[i] = static_cast<float>(buf.mem[kGuard + i]);
  if (buf.n != 0 && std::fwrite(out.data(), sizeof(float), buf.n, stdout) != buf.n) die("short write");
}

struct Case : gdn_case::Inputs {
  GdnParams p;
};

// The signature every gated_delta_step_{in}_{st} kernel must have for its InT and StT: a
// kernel named for other types does not convert to it, and fails to compile.
template <class InT, class StT>
using Kernel = void (*)(const device InT*, const device InT*, const device InT*, const device float*,
                        const device float*, device StT*, device InT*, const device float*,
                        constant GdnParams&, uint3, uint);

template <class InT, class StT>
void run(const Case& c, Kernel<InT, StT> kernel) {
  const GdnParams& p = c.p;
  auto q = convert<InT>(c.q);
  auto k = convert<InT>(c.k);
  auto v = convert<InT>(c.v);
  auto g = convert<float>(c.g);
  auto beta = convert<float>(c.beta);
  auto state = convert<StT>(c.state);
  auto mask = convert<float>(c.mask);
  // NaN until written: every y, padding included, must be stored by the kernel.
  Guarded<InT> y(std::size_t(p.batch) * p.steps * p.value_heads * p.value_dim);
  const GdnParams params = p;

  const uint3 groups{1, (p.value_dim + 3) / 4, p.batch * p.value_heads};
  const uint3 per_group{32, 4, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel(
        (const device InT*)q.data(), (const device InT*)k.data(), (const device InT*)v.data(),
        (const device float*)g.data(), (const device float*)beta.data(),
        (device StT*)state.data(), (device InT*)y.data(),
        // Unbound without a mask: a read would fault.
        p.has_mask != 0 ? (const device float*)mask.data() : nullptr,
        *(constant GdnParams*)&params, id.thread_position_in_grid, id.thread_index_in_simdgroup);
  });

  q.check_guards("q");
  k.check_guards("k");
  v.check_guards("v");
  state.check_guards("state");
  y.check_guards("y");
  write_f32(y);
  write_f32(state);
}

}  // namespace

int main() {
  guarded::g_harness = "gated_delta_harness";  // names it in gdn_case.h's errors
  const gdn_case::Header h = gdn_case::read_header("GDNEMU01");
  Case c;
  c.p = GdnParams{h.batch, h.steps, h.key_heads, h.value_heads, h.key_dim, h.value_dim, h.has_mask};
  const GdnParams& p = c.p;
  // The host side's contract: the kernel holds at most 8 keys per lane.
  if (p.key_dim == 0 || p.key_dim % 32 != 0 || p.key_dim > 256) die("key_dim must be a multiple of 32, at most 256");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) die("value_heads must be a multiple of key_heads");
  gdn_case::read_inputs(h, c);

  switch (h.in_type * 2 + h.state_type) {
    case 0: run<float, float>(c, gated_delta_step_f32_f32); break;
    case 1: run<float, bfloat>(c, gated_delta_step_f32_bf16); break;
    case 2: run<half, float>(c, gated_delta_step_f16_f32); break;
    case 3: run<half, bfloat>(c, gated_delta_step_f16_bf16); break;
    case 4: run<bfloat, float>(c, gated_delta_step_bf16_f32); break;
    case 5: run<bfloat, bfloat>(c, gated_delta_step_bf16_bf16); break;
    default: die("unknown in_type / state_type");
  }
  return guarded::finish();
}
