// out[j, i] = x[i, j] for a [rows, cols] matrix of f16 (or, variant BF16, bf16) elements: the copy
// that gives matmul_coopmat.comp a large operand with k contiguous (vk_matmul_kernels.cpp), the
// order its fragments load at twice the rate. 64 x 64 tiles through shared memory, so that both
// the reads (x's columns) and the writes (out's columns, x's rows) are contiguous along a warp.
// Variant PAIRS (rows and cols even, both tensors 4-byte aligned; f16 and bf16 alike, as bits)
// moves 32-bit words of two halves on both sides, half the memory instructions.
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_GOOGLE_include_directive : require
#if defined(BF16)
#extension GL_EXT_bfloat16 : require
#define ELEMENT bfloat16_t
#else
#define ELEMENT float16_t
#endif
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 2) buffer Halfs { ELEMENT v[]; };

layout(push_constant) uniform Push {
    Halfs x;
    Halfs o;
    uint rows, cols;  // of x
    uint tiles_r;     // tiles along x's rows
} pc;

const uint T = 64;

#if defined(PAIRS)
const uint STEPS = 256 / (T / 2);
shared uint words[T][T / 2 + 1];  // [x's column][x's rows 2 p, 2 p + 1]

void main() {
    uint g = flat_group();
    uint r0 = (g % pc.tiles_r) * T, c0 = (g / pc.tiles_r) * T;
    uint lane = gl_LocalInvocationID.x % (T / 2), step = gl_LocalInvocationID.x / (T / 2);
    Words x = Words(uint64_t(pc.x)), o = Words(uint64_t(pc.o));
    for (uint q = step; q < T; q += STEPS) {  // x's column c0 + q, rows r0 + 2 lane and the next
        uint i = r0 + 2 * lane, j = c0 + q;
        if (i < pc.rows && j < pc.cols) words[q][lane] = x.v[(i + j * pc.rows) / 2];
    }
    barrier();
    for (uint q = step; q < T; q += STEPS) {  // x's row r0 + q: out's rows c0 + 2 lane and the next
        uint i = r0 + q, j = c0 + 2 * lane;
        uint even = words[2 * lane][q / 2], odd = words[2 * lane + 1][q / 2];  // x's columns j, j + 1
        uint pair = q % 2 == 0 ? (even & 0xffffu) | (odd << 16) : (even >> 16) | (odd & 0xffff0000u);
        if (i < pc.rows && j < pc.cols) o.v[(j + i * pc.cols) / 2] = pair;
    }
}
#else
const uint STEPS = 256 / T;
shared ELEMENT tile[T][T + 2];  // [x's column][x's row]; rows 33 words apart: out's reads hit 32 banks

void main() {
    uint g = flat_group();
    uint r0 = (g % pc.tiles_r) * T, c0 = (g / pc.tiles_r) * T;
    uint lane = gl_LocalInvocationID.x % T, step = gl_LocalInvocationID.x / T;
    for (uint q = step; q < T; q += STEPS) {  // x's column c0 + q, rows r0 + lane
        uint i = r0 + lane, j = c0 + q;
        if (i < pc.rows && j < pc.cols) tile[q][lane] = pc.x.v[i + j * pc.rows];
    }
    barrier();
    for (uint q = step; q < T; q += STEPS) {  // out's column r0 + q (x's row), rows c0 + lane
        uint i = r0 + q, j = c0 + lane;
        if (i < pc.rows && j < pc.cols) pc.o.v[j + i * pc.cols] = tile[lane][q];
    }
}
#endif
