// qconv_dot.cuh — lesson 11's exercise: the dp4a inner loop of one output pixel of the int8
// convolution (lessons/11-quantization/README.md, exercise 2). Rewrite dp4a_conv_dot below; the
// rest of the convolution is the engine's, in cuda/quant.cu, which includes this file after the
// pieces it uses (QConvDims, kOT, kFlip, dp4a_filters), right before qconv2d_kernel, which calls
// it: it is part of quant.cu, kept apart so that the exercise is one file.
//
//   make test T='[cuda][quant]'     your kernel against the CPU's, integer for integer
#pragma once

namespace kiln::cuda {

// The output pixel whose window starts at (ih0, iw0) of the image x [C, H, W], against the kOT
// packed filters at filter_words [kOT, Kw] (byte i of word k4 is weight 4·k4 + i, in w's order
// (c, kh, kw), the last word zero-padded):
//   acc[j] += Σ_{c, kh, kw} (x[c, ih0 + kh·dilation, iw0 + kw·dilation] − 128) · w[j, (c·KH + kh)·KW + kw]
// where x outside the image reads as d.pad (its zero point: the u8 of the real 0). The window is
// walked in w's order; each 4 values are packed into one word, flipped to s8 (v ^ 0x80 = v − 128),
// then one __dp4a per filter multiplies them with the 4 matching weights. A partial last word
// keeps its top bytes 0, as the filters' padding does: they add nothing.
__device__ void dp4a_conv_dot(const uint8_t* x, const QConvDims& d, int64_t ih0, int64_t iw0,
                              const int32_t* filter_words, int32_t (&acc)[kOT]) {
    uint32_t values = 0;  // packed so far: `filled` bytes
    int filled = 0;
    int64_t k4 = 0;  // the filters' word these values pair with
    for (int64_t c = 0; c < d.C; c++)
        for (int64_t kh = 0; kh < d.KH; kh++)
            for (int64_t kw = 0; kw < d.KW; kw++) {
                const int64_t ih = ih0 + kh * d.dilation, iw = iw0 + kw * d.dilation;
                const bool inside = ih >= 0 && ih < d.H && iw >= 0 && iw < d.W;
                const uint32_t v = inside ? x[(c * d.H + ih) * d.W + iw] : d.pad;
                values |= (v ^ kFlip) << (8 * filled);
                if (++filled == 4) {
                    dp4a_filters(int(values), filter_words, d.Kw, k4++, acc);
                    values = 0;
                    filled = 0;
                }
            }
    if (filled > 0) dp4a_filters(int(values), filter_words, d.Kw, k4, acc);
}

}  // namespace kiln::cuda
