// fiber.cpp — stacks and context switches for the emulator's fibers (see fiber.h).
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if !defined(KILN_EMU_UCONTEXT)
// kiln_emu_switch(void** save_sp, void* load_sp): pushes the callee-saved registers of the
// System V ABI, stores the stack pointer, loads the other one and pops its registers; `ret`
// then continues wherever that context called kiln_emu_switch (or at a new fiber's entry).
// The floating-point control words are not switched: all fibers of an OS thread share them.
asm(R"(
    .pushsection .text
    .globl kiln_emu_switch
    .hidden kiln_emu_switch
    .type kiln_emu_switch, @function
    .p2align 4
kiln_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kiln_emu_switch, .-kiln_emu_switch
    .popsection
)");
#endif

namespace kiln::emu {

std::size_t fiber_stack_size() {
#if defined(KILN_EMU_ASAN)
    return 512 * 1024;
#else
    return 128 * 1024;
#endif
}

// Stacks are mapped, not allocated: pages cost memory only once touched, so 1024 threads of
// 128 KiB reserve address space but use a few KiB each.
Stack make_stack(std::size_t size) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* base = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) {
        std::fprintf(stderr, "kiln emu: cannot map a %zu-byte fiber stack\n", size);
        std::abort();
    }
    mprotect(base, page, PROT_NONE);  // the guard page
    return Stack{static_cast<char*>(base) + page, size};
}

void free_stack(Stack& s) {
    if (!s.lo) return;
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    munmap(s.lo - page, s.size + page);
    s = Stack{};
}

#if defined(KILN_EMU_UCONTEXT)

void context_start(Context& c, const Stack& s, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = s.lo;
    c.uc.uc_stack.ss_size = s.size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}

#else

// The new stack, from its top: a null return address (debuggers stop the backtrace there),
// the entry address that kiln_emu_switch's `ret` jumps to, and six zeroed registers for its
// pops. After `ret` the stack pointer is 8 below a 16-byte boundary, as at any function entry.
void context_start(Context& c, const Stack& s, void (*entry)()) {
    auto top = reinterpret_cast<std::uintptr_t>(s.lo + s.size) & ~std::uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(entry);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    c.sp = sp;
}

#endif

#if defined(KILN_EMU_ASAN)
void asan_unpoison(const Stack& s) { __asan_unpoison_memory_region(s.lo, s.size); }
#else
void asan_unpoison(const Stack&) {}
#endif

}  // namespace kiln::emu
