// main.cpp — the Catch2 entry point for all of kiln's tests (tests/*.cpp).
// Tags: [lessonNN] the chapter a test belongs to, [cpu] / [cuda] the backend it exercises.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
