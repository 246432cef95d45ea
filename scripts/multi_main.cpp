// multi_main.cpp — the entry point of a multi-call binary (the GPU check's bin/kiln-gpu and
// lab/kiln-lab, Makefile: "multi-call programs"): `BINARY NAME ARGS...` runs program NAME as
// `NAME ARGS...` would run. Each program's object was compiled with -Dmain=kiln_main_NAME, and
// the Makefile lists the names in KILN_MAINS as KILN_MAIN(lesson_04) KILN_MAIN(bench_train) ...
// A program is named with - or _ alike ("lesson-04" or "lesson_04"). Why: every program linked
// with libkiln.a holds all of its GPU kernels (megabytes), and a GPU machine lent for minutes
// receives at most 64 MiB; one binary for many programs carries the kernels once.
#include <cstdio>
#include <cstring>
#include <string>

#ifndef KILN_MAINS
#error "compile with -DKILN_MAINS='KILN_MAIN(name) ...' (the Makefile does)"
#endif

#define KILN_MAIN(name) int kiln_main_##name(int argc, char** argv);
KILN_MAINS
#undef KILN_MAIN

namespace {

struct Program {
    const char* name;
    int (*main)(int, char**);
};

#define KILN_MAIN(name) {#name, kiln_main_##name},
const Program kPrograms[] = {KILN_MAINS};
#undef KILN_MAIN

// "lesson-04" and "lesson_04" name the same program.
std::string normalized(const char* name) {
    std::string s = name;
    for (char& c : s)
        if (c == '-') c = '_';
    return s;
}

int usage(const char* self, const char* unknown) {
    if (unknown) std::fprintf(stderr, "%s: no program named '%s'. ", self, unknown);
    std::fprintf(stderr, "Usage: %s PROGRAM [ARGS...], PROGRAM one of:", self);
    for (const Program& p : kPrograms) std::fprintf(stderr, " %s", p.name);
    std::fprintf(stderr, "\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage(argv[0], nullptr);
    const std::string want = normalized(argv[1]);
    for (const Program& p : kPrograms)
        if (want == p.name) return p.main(argc - 1, argv + 1);  // argv[1], the name, is its argv[0]
    return usage(argv[0], argv[1]);
}
