// main.cpp — the Catch2 entry point for all of kiln's tests (tests/*.cpp).
// Tags: [lessonNN] the chapter a test belongs to, [cpu] / [cuda] the backend it exercises.
// After Catch2's summary, a line "skipped: N checks ..." when some check could not run on this
// machine (test::skip, fixtures.h); tests/run.sh adds N to its last line.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "fixtures.h"

int main(int argc, char* argv[]) {
    const int failed = Catch::Session().run(argc, argv);
    // On stderr: a reporter's stdout (-r xml) stays as Catch2 wrote it.
    std::fflush(stdout);
    if (const int n = kiln::test::skipped_checks())
        std::fprintf(stderr, "skipped: %d check%s this machine cannot run (each SKIPPED above says which)\n", n,
                     n == 1 ? "" : "s");
    return failed;
}
