// fiber.h — the emulator's fibers: a stack per emulated CUDA thread and a switch between them.
//
// On x86-64 the switch is six pushes, a stack-pointer swap and six pops (kiln_emu_switch in
// fiber.cpp): tens of nanoseconds, where ucontext's swapcontext makes a system call to save
// the signal mask. Elsewhere (or with -DKILN_EMU_UCONTEXT) ucontext is used.
//
// Under AddressSanitizer every switch is announced with __sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber, so ASan knows which stack is live and reports no false
// stack errors.
#pragma once

#include <cstddef>

#if !defined(__x86_64__) && !defined(KILN_EMU_UCONTEXT)
#define KILN_EMU_UCONTEXT 1
#endif
#if defined(KILN_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KILN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_EMU_ASAN 1
#endif
#endif
#if defined(KILN_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kiln::emu {

// A fiber stack: [lo, lo + size), with an inaccessible guard page below lo so that an
// overflow faults at once instead of overwriting the next stack.
struct Stack {
    char* lo = nullptr;
    std::size_t size = 0;
};
Stack make_stack(std::size_t size);
void free_stack(Stack& s);
// Bytes of stack each emulated thread gets (more under ASan, whose frames are larger).
std::size_t fiber_stack_size();

// A saved execution context: where a suspended fiber (or the OS thread) continues.
struct Context {
#if defined(KILN_EMU_UCONTEXT)
    ucontext_t uc;
#else
    void* sp = nullptr;
#endif
};

// Prepares `c` so that switching to it calls entry() on stack `s`. entry must never return.
void context_start(Context& c, const Stack& s, void (*entry)());

// Saves the running context in `from` and continues `to`. Inline, with the callers that
// switch inlined too: after a switch every `ret` up the new stack is mispredicted (the CPU's
// return-address predictor still holds the other stack's calls), so each frame between a
// barrier and the switch costs ~20 cycles; fewer frames, faster barriers.
#if defined(KILN_EMU_UCONTEXT)
inline void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#else
extern "C" void kiln_emu_switch(void** save_sp, void* load_sp);
inline void context_switch(Context& from, Context& to) { kiln_emu_switch(&from.sp, to.sp); }
#endif

// ASan bookkeeping around a switch (no-ops without ASan). Before a switch: the stack being
// entered; fake_save == nullptr says the current fiber ends for good. After a switch: in the
// context that now runs, with what start_switch saved for it.
#if defined(KILN_EMU_ASAN)
inline void asan_start_switch(void** fake_save, const void* bottom, std::size_t size) {
    __sanitizer_start_switch_fiber(fake_save, bottom, size);
}
inline void asan_finish_switch(void* fake_save, const void** old_bottom, std::size_t* old_size) {
    __sanitizer_finish_switch_fiber(fake_save, old_bottom, old_size);
}
#else
inline void asan_start_switch(void**, const void*, std::size_t) {}
inline void asan_finish_switch(void*, const void**, std::size_t*) {}
#endif
// Clears the shadow of a stack whose frames were abandoned (a failed block).
void asan_unpoison(const Stack& s);

}  // namespace kiln::emu
