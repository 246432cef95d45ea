// stb_warnings.h — KILN_STB_BEGIN and KILN_STB_END go around the #include of an stb header
// (stb_image, stb_image_write, stb_easy_font, compiled into a kiln file): their warnings are not
// kiln's, and -Werror would stop on them. (clang has no -Wmaybe-uninitialized: told to let that be.)
#pragma once

#if defined(__clang__)
#define KILN_STB_UNKNOWN_WARNINGS _Pragma("GCC diagnostic ignored \"-Wunknown-warning-option\"")
#else
#define KILN_STB_UNKNOWN_WARNINGS
#endif

#define KILN_STB_BEGIN                                                  \
    _Pragma("GCC diagnostic push") KILN_STB_UNKNOWN_WARNINGS            \
    _Pragma("GCC diagnostic ignored \"-Wunused-function\"")             \
    _Pragma("GCC diagnostic ignored \"-Wunused-parameter\"")            \
    _Pragma("GCC diagnostic ignored \"-Wunused-but-set-variable\"")     \
    _Pragma("GCC diagnostic ignored \"-Wsign-compare\"")                \
    _Pragma("GCC diagnostic ignored \"-Wimplicit-fallthrough\"")        \
    _Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"")  \
    _Pragma("GCC diagnostic ignored \"-Wtype-limits\"")                 \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")

#define KILN_STB_END _Pragma("GCC diagnostic pop")
