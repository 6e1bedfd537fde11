// Metal's simdgroup functions for metal_emu.h. Each is a rendezvous of the 32 lanes of a
// simdgroup (see metal_emu_fibers.h): the result is computed once all lanes have handed in
// their operand from the same call site, so a lane that skips a call, or makes it from
// elsewhere, aborts the run. Arguments Metal requires to be the same for every lane (a
// broadcast lane, a shuffle mask or delta) or to be a valid lane abort when they are not.
// Included by metal_emu.h only.
#pragma once

namespace metal_emu {

template <class T>
T operand(const SimdCall& c) {
  T v;
  std::memcpy(&v, c.in, sizeof(T));
  return v;
}

template <class T>
void answer(SimdCall& c, const T& v) {
  std::memcpy(c.out, &v, sizeof(T));
}

// Hands x to the simdgroup and waits for this lane's result; `site` is the kernel's call.
template <class R, class T>
R simd_collective(const char* name, void (*resolve)(SimdCall*), const T& x, unsigned arg, Site site) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16, "simdgroup operands are scalars or vectors");
  static_assert(std::is_trivially_copyable<R>::value && sizeof(R) <= 16, "simdgroup results are scalars or vectors");
  Threadgroup& tg = Threadgroup::current(name);
  SimdCall& c = tg.my_call();
  c.name = name;
  c.site = site;
  c.resolve = resolve;
  c.arg = arg;
  std::memcpy(c.in, &x, sizeof(T));
  tg.wait_simd();
  R r;
  std::memcpy(&r, c.out, sizeof(R));
  return r;
}

// Integer sums wrap, as on the GPU, instead of being undefined.
template <class T>
T add(T a, T b) {
  if constexpr (std::is_same<T, int>::value) {
    return int(unsigned(a) + unsigned(b));
  } else {
    return T(a + b);
  }
}
// A NaN operand wins, so that poisoned input stays visible (the GPU's choice is not
// documented).
template <class T>
T max_of(T a, T b) {
  return a != a ? a : b != b ? b : a < b ? b : a;
}
template <class T>
T min_of(T a, T b) {
  return a != a ? a : b != b ? b : b < a ? b : a;
}

// A butterfly over lanes (xor 16, 8, 4, 2, 1), the shape of a hardware shuffle reduction.
// Every lane gets lane 0's value, so all 32 agree bit for bit.
template <class T, T (*Op)(T, T)>
void butterfly(SimdCall* lanes) {
  T v[kSimdWidth];
  for (int i = 0; i < kSimdWidth; ++i) v[i] = operand<T>(lanes[i]);
  for (int off = kSimdWidth / 2; off > 0; off /= 2) {
    T next[kSimdWidth];
    for (int i = 0; i < kSimdWidth; ++i) next[i] = Op(v[i], v[i ^ off]);
    for (int i = 0; i < kSimdWidth; ++i) v[i] = next[i];
  }
  for (int i = 0; i < kSimdWidth; ++i) answer(lanes[i], v[0]);
}

// Sums in lane order: lane i gets lanes 0..i-1 (exclusive) or 0..i (inclusive).
template <class T, bool Inclusive>
void prefix_sum(SimdCall* lanes) {
  T acc = T(0);
  for (int i = 0; i < kSimdWidth; ++i) {
    const T v = operand<T>(lanes[i]);
    if (Inclusive) acc = add(acc, v);
    answer(lanes[i], acc);
    if (!Inclusive) acc = add(acc, v);
  }
}

inline void same_arg(SimdCall* lanes, const char* what) {
  for (int i = 1; i < kSimdWidth; ++i) {
    if (lanes[i].arg != lanes[0].arg) {
      fail("%s: lane 0 passed %s %u but lane %d passed %u; Metal requires the same value in every lane",
           lanes[0].name, what, lanes[0].arg, i, lanes[i].arg);
    }
  }
}

inline void valid_lane(SimdCall* lanes, int i, const char* what) {
  if (lanes[i].arg >= unsigned(kSimdWidth)) fail("%s: lane %d passed %s %u, not a lane", lanes[0].name, i, what, lanes[i].arg);
}

enum class Move { kBroadcast, kBroadcastFirst, kShuffle, kXor, kDown, kUp };

// Every lane's result is some lane's operand, bytes unchanged.
template <class T, Move M>
void move(SimdCall* lanes) {
  T v[kSimdWidth];
  for (int i = 0; i < kSimdWidth; ++i) v[i] = operand<T>(lanes[i]);
  if (M == Move::kBroadcast || M == Move::kXor || M == Move::kDown || M == Move::kUp) {
    same_arg(lanes, M == Move::kBroadcast ? "lane" : M == Move::kXor ? "mask" : "delta");
  }
  for (int i = 0; i < kSimdWidth; ++i) {
    const unsigned a = lanes[i].arg;
    int from = i;
    switch (M) {
      case Move::kBroadcast:
      case Move::kShuffle:
        valid_lane(lanes, i, "lane");
        from = int(a);
        break;
      case Move::kBroadcastFirst: from = 0; break;
      case Move::kXor:
        valid_lane(lanes, i, "mask");
        from = i ^ int(a);
        break;
      // Lanes whose source lies outside the simdgroup keep their own value.
      case Move::kDown: from = a < unsigned(kSimdWidth - i) ? i + int(a) : i; break;
      case Move::kUp: from = a <= unsigned(i) ? i - int(a) : i; break;
    }
    answer(lanes[i], v[from]);
  }
}

inline void vote_any(SimdCall* lanes) {
  bool r = false;
  for (int i = 0; i < kSimdWidth; ++i) r = r || operand<bool>(lanes[i]);
  for (int i = 0; i < kSimdWidth; ++i) answer(lanes[i], r);
}
inline void vote_all(SimdCall* lanes) {
  bool r = true;
  for (int i = 0; i < kSimdWidth; ++i) r = r && operand<bool>(lanes[i]);
  for (int i = 0; i < kSimdWidth; ++i) answer(lanes[i], r);
}
// With every lane active, the first is lane 0.
inline void first_lane(SimdCall* lanes) {
  for (int i = 0; i < kSimdWidth; ++i) answer(lanes[i], i == 0);
}
// simdgroup_barrier: only the rendezvous, with the same mem_flags everywhere.
inline void simd_rendezvous(SimdCall* lanes) { same_arg(lanes, "mem_flags"); }

}  // namespace metal_emu

namespace metal {

// The trailing Site argument is filled in at the kernel's call (see Site in metal_emu_fibers.h).
#define METAL_EMU_REDUCTION(name, T, resolver)                                                   \
  inline T name(T x, metal_emu::Site site = metal_emu::Site::here()) {                            \
    return metal_emu::simd_collective<T>(#name, &resolver, x, 0, site);                            \
  }
#define METAL_EMU_ARITHMETIC(T)                                                                  \
  METAL_EMU_REDUCTION(simd_sum, T, (metal_emu::butterfly<T, metal_emu::add<T>>))                 \
  METAL_EMU_REDUCTION(simd_max, T, (metal_emu::butterfly<T, metal_emu::max_of<T>>))              \
  METAL_EMU_REDUCTION(simd_min, T, (metal_emu::butterfly<T, metal_emu::min_of<T>>))              \
  METAL_EMU_REDUCTION(simd_prefix_exclusive_sum, T, (metal_emu::prefix_sum<T, false>))           \
  METAL_EMU_REDUCTION(simd_prefix_inclusive_sum, T, (metal_emu::prefix_sum<T, true>))

METAL_EMU_ARITHMETIC(float)
METAL_EMU_ARITHMETIC(half)
METAL_EMU_ARITHMETIC(int)
METAL_EMU_ARITHMETIC(uint)

#undef METAL_EMU_ARITHMETIC
#undef METAL_EMU_REDUCTION

template <class T>
T simd_broadcast(T x, uint lane, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_broadcast", &metal_emu::move<T, metal_emu::Move::kBroadcast>, x, lane, site);
}
template <class T>
T simd_broadcast_first(T x, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_broadcast_first", &metal_emu::move<T, metal_emu::Move::kBroadcastFirst>,
                                       x, 0, site);
}
template <class T>
T simd_shuffle(T x, uint lane, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_shuffle", &metal_emu::move<T, metal_emu::Move::kShuffle>, x, lane, site);
}
template <class T>
T simd_shuffle_xor(T x, uint mask, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_shuffle_xor", &metal_emu::move<T, metal_emu::Move::kXor>, x, mask, site);
}
template <class T>
T simd_shuffle_down(T x, uint delta, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_shuffle_down", &metal_emu::move<T, metal_emu::Move::kDown>, x, delta, site);
}
template <class T>
T simd_shuffle_up(T x, uint delta, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<T>("simd_shuffle_up", &metal_emu::move<T, metal_emu::Move::kUp>, x, delta, site);
}
inline bool simd_any(bool x, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<bool>("simd_any", &metal_emu::vote_any, x, 0, site);
}
inline bool simd_all(bool x, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<bool>("simd_all", &metal_emu::vote_all, x, 0, site);
}
inline bool simd_is_first(metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<bool>("simd_is_first", &metal_emu::first_lane, false, 0, site);
}

}  // namespace metal
