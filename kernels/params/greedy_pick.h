// Parameters of the greedy pick kernels (kernels/greedy_pick.metal, kernels/greedy_pick.cu),
// declared once for the shaders, the emulation harnesses and the host: `GreedyPickParams` is
// mirrored field for field by `GreedyPickParams` in crates/gdn-ops/src/ops/greedy_pick/mod.rs
// (#[repr(C)]); the partial record and the block width are only seen by the kernels and the
// harnesses (the host sizes the partials buffer as 3 words a record).
#ifndef QWEN_GDN_PARAMS_GREEDY_PICK_H
#define QWEN_GDN_PARAMS_GREEDY_PICK_H

// Threads of a slice block (8 simdgroups / warps); `THREADS` in ops/greedy_pick/mod.rs.
#define GREEDY_PICK_THREADS 256
// The index of a record that saw no finite value (it loses to every real one).
#define GREEDY_PICK_NONE 0xFFFFFFFFu

struct GreedyPickParams {
  unsigned int rows;    // N: logits rows
  unsigned int vocab;   // V: values per row, 1 <= V < 2^32 - 1
  unsigned int blocks;  // B: slice blocks per row, 1..=256
  unsigned int slice;   // values per slice block: block b reads [b * slice, min(V, (b + 1) * slice))
};

// What a slice block leaves for the finish pass: partials[row * B + b].
struct GreedyPickPartial {
  float value;             // the largest finite value of the slice, -INFINITY when none
  unsigned int index;      // its first index in the row, GREEDY_PICK_NONE when none
  unsigned int nonfinite;  // NaN and +-Inf values in the slice
};

#endif
