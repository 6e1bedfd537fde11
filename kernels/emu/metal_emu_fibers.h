// The scheduler behind metal_emu.h: every thread of one threadgroup is a fiber (ucontext),
// and the fibers only ever stop at a collective (a simdgroup function or a barrier). A
// collective completes when every thread it concerns has reached it from the same call
// site; anything else is a divergence Metal leaves undefined, so it aborts the run with a
// message instead of guessing what the GPU would do. Included by metal_emu.h only.
#pragma once

namespace metal_emu {

constexpr int kSimdWidth = 32;
// Metal's limits (maxTotalThreadsPerThreadgroup; threadgroup memory on Apple GPUs).
constexpr unsigned kMaxThreadsPerThreadgroup = 1024;
constexpr std::size_t kMaxThreadgroupMemory = 32 * 1024;

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::fputs("metal_emu: ", stderr);
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::abort();
}

// Where in the kernel's source a collective was called. A source location, not a return
// address: the optimizer may duplicate one call into several (tail duplication) or merge two
// into one, which would make a correct kernel abort or a divergent one pass. Filled in at
// the call site by default arguments, like std::source_location.
struct Site {
  const char* file;
  unsigned line, column;
  static Site here(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE(),
                   unsigned column = __builtin_COLUMN()) {
    return Site{file, line, column};
  }
  bool operator!=(const Site& o) const { return line != o.line || column != o.column || std::strcmp(file, o.file) != 0; }
};

// One lane's part in a simdgroup function: its operand, the answer it gets back, and what
// identifies the call, which all 32 lanes must agree on.
struct SimdCall {
  const char* name;                    // "simd_sum", for messages
  Site site;                           // the kernel's call
  void (*resolve)(SimdCall* lanes);    // the operation for the operand's type; 32 entries
  unsigned arg;                        // lane, mask or delta, where the function has one
  alignas(16) unsigned char in[16];    // the operand, any type of up to 16 bytes
  alignas(16) unsigned char out[16];   // the result
};

class Threadgroup {
 public:
  // Stacks are mapped lazily and reused for every threadgroup of a dispatch; each has an
  // inaccessible page below it, so an overflow faults instead of corrupting its neighbour.
  explicit Threadgroup(unsigned threads, std::size_t stack_bytes = 256 * 1024)
      : threads_(threads), stack_bytes_(stack_bytes), fibers_(threads), wait_(threads), calls_(threads),
        barrier_site_(threads), barrier_flags_(threads) {
    page_ = std::size_t(sysconf(_SC_PAGESIZE));
    slot_ = page_ + (stack_bytes_ + page_ - 1) / page_ * page_;
    void* m = mmap(nullptr, slot_ * threads_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("cannot map %u fiber stacks", threads_);
    stacks_ = static_cast<char*>(m);
    for (unsigned t = 0; t < threads_; ++t) {
      if (mprotect(stacks_ + slot_ * t, page_, PROT_NONE) != 0) fail("mprotect failed");
    }
  }
  Threadgroup(const Threadgroup&) = delete;
  Threadgroup& operator=(const Threadgroup&) = delete;
  ~Threadgroup() { munmap(stacks_, slot_ * threads_); }

  // Runs body(thread_index) for every thread to completion, releasing collectives as they
  // fill up. Threads run in index order between collectives.
  template <class Body>
  void run(Body& body) {
    if (current_ != nullptr) fail("dispatch_threadgroups called from inside a kernel");
    body_ = &body;
    invoke_ = [](void* b, unsigned t) { (*static_cast<Body*>(b))(t); };
    for (unsigned t = 0; t < threads_; ++t) {
      ucontext_t& c = fibers_[t];
      if (getcontext(&c) != 0) fail("getcontext failed");
      c.uc_stack.ss_sp = stacks_ + slot_ * t + page_;
      c.uc_stack.ss_size = slot_ - page_;
      c.uc_link = &scheduler_;
      makecontext(&c, reinterpret_cast<void (*)()>(&Threadgroup::trampoline), 1, int(t));
      wait_[t] = kRunnable;
    }
    current_ = this;
    for (;;) {
      for (unsigned t = 0; t < threads_; ++t) {
        if (wait_[t] != kRunnable) continue;
        thread_ = t;
        if (swapcontext(&scheduler_, &fibers_[t]) != 0) fail("swapcontext failed");
      }
      if (release_simdgroups()) continue;
      if (!release_barrier()) break;
    }
    current_ = nullptr;
  }

  // The threadgroup the calling fiber belongs to; `what` names the caller for the message.
  static Threadgroup& current(const char* what) {
    if (current_ == nullptr) fail("%s called outside a kernel dispatch", what);
    return *current_;
  }

  // The calling thread's index in its threadgroup, and the threadgroup's size.
  unsigned thread_index() const { return thread_; }
  unsigned threads() const { return threads_; }

  // The calling thread's slot for a simdgroup function, then the wait for its simdgroup.
  SimdCall& my_call() { return calls_[thread_]; }
  void wait_simd() { block(kAtSimd); }

  void barrier(Site site, unsigned flags) {
    barrier_site_[thread_] = site;
    barrier_flags_[thread_] = flags;
    block(kAtBarrier);
  }

 private:
  enum Wait : unsigned char { kRunnable, kAtSimd, kAtBarrier, kDone };

  static void trampoline(int t) {
    Threadgroup* tg = current_;
    tg->invoke_(tg->body_, unsigned(t));
    tg->wait_[unsigned(t)] = kDone;
    // Returning resumes uc_link, the scheduler.
  }

  void block(Wait why) {
    const unsigned t = thread_;
    wait_[t] = why;
    if (swapcontext(&fibers_[t], &scheduler_) != 0) fail("swapcontext failed");
  }

  static const char* doing(Wait w) {
    return w == kDone ? "returned" : w == kAtBarrier ? "waits at threadgroup_barrier" : "is elsewhere";
  }

  // Completes every simdgroup function all 32 lanes of a simdgroup are waiting at.
  bool release_simdgroups() {
    bool released = false;
    for (unsigned first = 0; first < threads_; first += kSimdWidth) {
      unsigned at = 0, odd = first;
      for (unsigned t = first; t < first + kSimdWidth; ++t) {
        if (wait_[t] == kAtSimd) ++at;
        else odd = t;
      }
      if (at == 0) continue;
      SimdCall* lanes = &calls_[first];
      const unsigned sg = first / kSimdWidth;
      if (at != unsigned(kSimdWidth)) {
        unsigned waiting = first;
        while (wait_[waiting] != kAtSimd) ++waiting;
        fail("divergent simdgroup %u: lane %u reached %s while lane %u %s", sg, waiting - first,
             calls_[waiting].name, odd - first, doing(wait_[odd]));
      }
      for (int lane = 1; lane < kSimdWidth; ++lane) {
        if (lanes[lane].site != lanes[0].site || lanes[lane].resolve != lanes[0].resolve) {
          fail("divergent simdgroup %u: lane 0 called %s at %s:%u:%u but lane %d %s at %s:%u:%u", sg,
               lanes[0].name, lanes[0].site.file, lanes[0].site.line, lanes[0].site.column, lane, lanes[lane].name,
               lanes[lane].site.file, lanes[lane].site.line, lanes[lane].site.column);
        }
      }
      lanes[0].resolve(lanes);
      for (unsigned t = first; t < first + kSimdWidth; ++t) wait_[t] = kRunnable;
      released = true;
    }
    return released;
  }

  // Once no simdgroup can move, every thread that has not returned is at a barrier; the
  // barrier completes only when that is every thread of the threadgroup.
  bool release_barrier() {
    unsigned at = 0, done = 0, waiting = 0;
    for (unsigned t = 0; t < threads_; ++t) {
      if (wait_[t] == kAtBarrier) {
        if (at++ == 0) waiting = t;
      } else {
        done = t;
      }
    }
    if (at == 0) return false;
    if (at != threads_) {
      fail("divergent barrier: thread %u waits at threadgroup_barrier while thread %u returned", waiting, done);
    }
    for (unsigned t = 1; t < threads_; ++t) {
      if (barrier_site_[t] != barrier_site_[0]) {
        const Site& a = barrier_site_[0];
        const Site& b = barrier_site_[t];
        fail("divergent barrier: thread 0 waits at threadgroup_barrier at %s:%u:%u but thread %u at %s:%u:%u", a.file,
             a.line, a.column, t, b.file, b.line, b.column);
      }
      if (barrier_flags_[t] != barrier_flags_[0]) {
        fail("divergent barrier: threads 0 and %u passed different mem_flags to threadgroup_barrier", t);
      }
    }
    for (unsigned t = 0; t < threads_; ++t) wait_[t] = kRunnable;
    return true;
  }

  static inline thread_local Threadgroup* current_ = nullptr;

  unsigned threads_;
  std::size_t stack_bytes_, page_ = 0, slot_ = 0;
  char* stacks_ = nullptr;
  ucontext_t scheduler_{};
  std::vector<ucontext_t> fibers_;
  std::vector<Wait> wait_;
  std::vector<SimdCall> calls_;
  std::vector<Site> barrier_site_;
  std::vector<unsigned> barrier_flags_;
  unsigned thread_ = 0;
  void* body_ = nullptr;
  void (*invoke_)(void*, unsigned) = nullptr;
};

}  // namespace metal_emu
