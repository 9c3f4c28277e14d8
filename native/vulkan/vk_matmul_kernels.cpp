// matmul and linear on the GPU: which kernel multiplies a product (cooperative matrices for f16 /
// bf16 where the device has them, else f32 SIMT tiles sized to the output), its shader variant and
// its push constants.
#include <algorithm>
#include <cstddef>
#include <string>

#include "backend.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"

namespace rk {

using vk::ctx;
using vk::record;
using vk::span;
using vk::u32;

namespace {

struct MatmulPush {
    uint64_t a, b, c;
    uint32_t m, n, k, lda, ldb, ta, tb, ne2, sa2, sa3, sb2, sb3, groups_m;
    uint32_t split_k;  // matmul_small.comp's reduction per z slice (k where it is not split)
};

// The linear op's push constants: matmul's, then its bias and activation.
struct LinearPush {
    MatmulPush matmul;
    uint64_t bias;
    uint32_t activation;
};

// matmul_small.comp's RELU_MASK variant's (matmul_relu_mask): matmul's, then y's address.
struct MaskPush {
    MatmulPush matmul;
    uint64_t mask;
};

// matmul_coopmat.comp's: the linear op's fields (bias unused by plain matmul), then which operands
// may be read in whole 16-byte chunks, right after the activation as the shader's std430 block
// has it (a LinearPush member would put it after that struct's 4 bytes of tail padding, where the
// shader read the padding instead).
struct CoopmatPush {
    MatmulPush matmul;
    uint64_t bias;
    uint32_t activation;
    uint32_t chunked;
};
static_assert(offsetof(CoopmatPush, bias) == 80 && offsetof(CoopmatPush, chunked) == 92,
              "CoopmatPush must match matmul_coopmat.comp's push constants");

// The matmul kernel for a product: cooperative matrices for f16 or bf16 where the device has them
// for that dtype, else the f32 SIMT kernel (16-bit operands widened first) with the largest tiles
// the output has enough of and fills (tiles_fit): 128 x 128 where that keeps a large GPU busy, 64 x 64, and 16 x 16 for
// outputs that make fewer than kSmallTilesBelow 64 x 64 tiles (the layers of an RL network at a
// small batch), or fewer than kLargeTilesWanted over a reduction of at least kLongReduction (each
// of a few 64 x 64 tiles would walk all of it alone: NatureCNN's 3136 x 512 layer's input
// gradient at batch 32 is 49 of them over k = 512).
enum class MatmulKernel { tiled_small, tiled, tiled_large, coopmat };

constexpr uint64_t kLargeTilesWanted = 128;  // about one per multiprocessor of a large GPU (the H200 has 132)
constexpr uint64_t kSmallTilesBelow = 32;    // a quarter of those: too few to spread k's work
constexpr int64_t kLongReduction = 512;
// 16 x 16 tiles still fewer than kLargeTilesWanted cut a reduction of at least 2 kMinSplitK into
// slices of at least kMinSplitK (multiples of matmul_small.comp's BK = kSmallSliceK) until about
// kTargetGroups workgroups run; sum_splits.comp adds the slices' partial outputs in order.
constexpr int64_t kSmallSliceK = 64, kMinSplitK = 256, kTargetGroups = 512;

// A kernel's output tile: rows x columns per workgroup.
struct Tile {
    uint32_t rows, columns;
};

Tile tile_shape(MatmulKernel kernel) {
    switch (kernel) {
        case MatmulKernel::tiled_small: return {16, 16};
        case MatmulKernel::tiled: return {64, 64};
        case MatmulKernel::tiled_large: return {128, 128};
        case MatmulKernel::coopmat: return {128, 256};
    }
    return {64, 64};
}

// Workgroups `kernel` would run for an [m, n] output with `batch` slices.
uint64_t tile_count(MatmulKernel kernel, int64_t m, int64_t n, int64_t batch) {
    const Tile tile = tile_shape(kernel);
    return uint64_t((m + tile.rows - 1) / tile.rows) * uint64_t((n + tile.columns - 1) / tile.columns) * uint64_t(batch);
}

// Whether the device multiplies operands of this dtype on cooperative matrices.
bool on_cooperative_matrices(DType dtype) {
    const vk::Limits& limits = ctx().limits();
    return (dtype == DType::f16 && limits.cooperative_matrix_f16) || (dtype == DType::bf16 && limits.cooperative_matrix_bf16);
}

// Whether `kernel`'s tiles cover an [m, n] output with at most twice its elements: the many small
// products of a batch (a chunked recurrence's 16 x 16 or 16 x 64 per chunk) would otherwise each
// take a tile of 128 x 128, its work mostly on padding (a 16384-batch of [16, 64] @ [64, 16] took
// about 1 ms on the H200 that way).
bool tiles_fit(MatmulKernel kernel, int64_t m, int64_t n) {
    const Tile tile = tile_shape(kernel);
    const int64_t rows = (m + tile.rows - 1) / tile.rows * tile.rows;
    const int64_t columns = (n + tile.columns - 1) / tile.columns * tile.columns;
    return rows * columns <= 2 * m * n;
}

MatmulKernel choose_matmul(DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch) {
    if (on_cooperative_matrices(dtype)) return MatmulKernel::coopmat;
    if (tile_count(MatmulKernel::tiled_large, m, n, batch) >= kLargeTilesWanted &&
        tiles_fit(MatmulKernel::tiled_large, m, n))
        return MatmulKernel::tiled_large;
    const uint64_t tiles = tile_count(MatmulKernel::tiled, m, n, batch);
    const bool few_over_long_k = tiles < kLargeTilesWanted && k >= kLongReduction;
    return tiles >= kSmallTilesBelow && !few_over_long_k && tiles_fit(MatmulKernel::tiled, m, n)
               ? MatmulKernel::tiled
               : MatmulKernel::tiled_small;
}

// matmul_small.comp's reduction per z slice for a product over k: k itself (one slice) unless its
// 16 x 16 tiles are few and k is long.
int64_t small_split_k(int64_t m, int64_t n, int64_t k, int64_t batch) {
    const uint64_t tiles = tile_count(MatmulKernel::tiled_small, m, n, batch);
    const int64_t splits = std::min<int64_t>(k / kMinSplitK, (kTargetGroups + int64_t(tiles) - 1) / int64_t(tiles));
    if (tiles >= kLargeTilesWanted || splits < 2) return std::max<int64_t>(k, 1);
    const int64_t length = (k + splits - 1) / splits;
    return (length + kSmallSliceK - 1) / kSmallSliceK * kSmallSliceK;
}

// The shader variant of a kernel: matmul.comp's or matmul_coopmat.comp's, plain or LINEAR; the
// cooperative-matrix kernel has one per transpose (its shared-memory layouts are fixed at compile
// time), and a CHUNKED one of each for operands that are both read in 16-byte chunks, for f16 and
// bf16.
std::string matmul_shader(MatmulKernel kernel, bool linear, bool ta, bool tb, bool chunked, DType dtype) {
    const std::string base = linear ? "matmul_linear" : "matmul";
    switch (kernel) {
        case MatmulKernel::tiled_small: return base + "_small";
        case MatmulKernel::tiled: return base;
        case MatmulKernel::tiled_large: return base + "_large";
        case MatmulKernel::coopmat:
            return base + "_coopmat" + (dtype == DType::bf16 ? "_bf16" : "") + (ta ? "_ta" : "") + (tb ? "_tb" : "") +
                   (chunked ? "_chunked" : "");
    }
    return base;
}

// matmul.comp's push constants for C = op(A) @ op(B) into out, and its workgroup count.
MatmulPush matmul_push(const TensorImpl& a, const TensorImpl& b, bool ta, bool tb, const TensorImpl& out,
                       Tile tile, uint64_t& tiles) {
    MatmulPush p{a.address(), b.address(), out.address()};
    // The kernels index each operand and the output, batch slices included, with 32-bit integers.
    u32(a.numel(), "matmul");
    u32(b.numel(), "matmul");
    u32(out.numel(), "matmul");
    p.m = u32(out.ne[0], "matmul");
    p.n = u32(out.ne[1], "matmul");
    p.k = u32(ta ? a.ne[0] : a.ne[1], "matmul");
    p.split_k = std::max<uint32_t>(p.k, 1);
    p.lda = u32(a.ne[0], "matmul");
    p.ldb = u32(b.ne[0], "matmul");
    p.ta = ta;
    p.tb = tb;
    p.ne2 = u32(out.ne[2], "matmul");
    const int64_t a_slice = a.ne[0] * a.ne[1], b_slice = b.ne[0] * b.ne[1];
    p.sa2 = a.ne[2] == 1 ? 0 : u32(a_slice, "matmul");
    p.sa3 = a.ne[3] == 1 ? 0 : u32(a_slice * a.ne[2], "matmul");
    p.sb2 = b.ne[2] == 1 ? 0 : u32(b_slice, "matmul");
    p.sb3 = b.ne[3] == 1 ? 0 : u32(b_slice * b.ne[2], "matmul");
    p.groups_m = (p.m + tile.rows - 1) / tile.rows;
    tiles = uint64_t(p.groups_m) * ((p.n + tile.columns - 1) / tile.columns);
    return p;
}

// Whether a 16-bit operand can be read in 16-byte chunks: 16-byte aligned, and its leading
// dimension (hence every column and batch slice) a multiple of 8 halves.
bool reads_in_chunks(const TensorImpl& t) { return t.address() % 16 == 0 && t.ne[0] % 8 == 0; }

// The cooperative-matrix kernel loads its fragments from k-contiguous slices at twice the rate of
// the other order (H100, f16 at 4096: 190 TFLOP/s where op(A) and op(B) are both k-contiguous in
// memory, 80-110 where either is not; staging a slice transposed, in the kernel, measured no
// faster). So a large product reads an operand whose other dimension is contiguous (A's rows, or
// op(B)'s columns) from a copy made k-contiguous by coopmat_transpose.comp, which moves it twice at
// memory speed (about 30 us for 4096 x 4096 f16). It pays where the product's other side is wide
// (the time saved grows with n for A, with m for B, the copy's not) and the product long enough
// that a dependency level of its own (a few us) is small beside it.
constexpr int64_t kTransposeMinOtherSide = 512;
constexpr int64_t kTransposeMinWork = int64_t(1) << 30;  // m n k

// Whether an operand of `slices` matrices (a batch is not copied) is copied for a product of
// m n k = `work` whose other side (n for A, m for op(B)) is `other_side`.
bool worth_transposing(int64_t slices, int64_t other_side, int64_t work) {
    return slices == 1 && other_side >= kTransposeMinOtherSide && work >= kTransposeMinWork;
}

// A [cols, rows] copy of the 16-bit matrix x ([rows, cols]), recorded (coopmat_transpose.comp).
TensorPtr transposed_copy(const TensorImpl& x, const char* op) {
    constexpr uint32_t kTile = 64;  // coopmat_transpose.comp's T
    u32(x.numel(), op);  // the shader's 32-bit indices
    TensorPtr out = make_on(Device::gpu, {x.ne[1], x.ne[0], 1, 1}, 2, x.dtype, op);
    struct Push {
        uint64_t x, o;
        uint32_t rows, cols, tiles_r;
    } p{x.address(), out->address(), u32(x.ne[0], op), u32(x.ne[1], op), 0};
    p.tiles_r = (p.rows + kTile - 1) / kTile;
    const uint64_t tiles = uint64_t(p.tiles_r) * ((p.cols + kTile - 1) / kTile);
    // Words of two halves where every pair lies whole and aligned on both sides (PAIRS).
    const bool pairs = p.rows % 2 == 0 && p.cols % 2 == 0 && x.address() % 4 == 0 && out->address() % 4 == 0;
    const char* shader = pairs ? "coopmat_transpose_pairs"
                               : x.dtype == DType::bf16 ? "coopmat_transpose_bf16" : "coopmat_transpose";
    record(shader, p, tiles, {span(x)}, {span(*out)});
    return out;
}

// Records the 16 x 16 kernel with its reduction cut into slices of p.split_k: the plain kernel
// writes each slice's partial output, then sum_splits(_epilogue) adds them in order (and applies the
// linear op's bias and activation).
void record_split_small(const MatmulPush& p, const TensorImpl* bias, uint32_t activation, uint32_t batches,
                        std::vector<vk::Range> reads, TensorImpl& out, const char* op) {
    const int64_t splits = (int64_t(p.k) + p.split_k - 1) / p.split_k;
    const uint32_t z = u32(size_mul(batches, splits), op);
    if (z > 65535) throw std::invalid_argument(std::string(op) + ": too many slices of the product for the GPU kernel");
    TensorPtr partials = vk::split_partials(out, splits, op);
    MatmulPush sliced = p;
    sliced.c = partials->address();
    record("matmul_small", sliced, uint64_t(p.groups_m) * ((p.n + 15) / 16), reads, {span(*partials)}, z);
    vk::record_sum_splits(*partials, uint32_t(splits), {bias, p.m, 1, activation}, out, op);
}

// The push constants of batch slices z0 .. z0 + count - 1 of a product whose batch lies along dim 2
// alone: its operands' and output's addresses moved to slice z0, and count slices along dim 2.
MatmulPush batch_slices(MatmulPush p, uint32_t z0, uint32_t count, size_t element_bytes) {
    p.a += uint64_t(z0) * p.sa2 * element_bytes;
    p.b += uint64_t(z0) * p.sb2 * element_bytes;
    p.c += uint64_t(z0) * p.m * p.n * element_bytes;
    p.ne2 = count;
    return p;
}

// Records act(op(A) @ op(B) + bias) (no bias or activation when bias is null) with the kernel the
// dtype, device and shape call for; a batch of more slices than a dispatch's z may count (65535
// on NVIDIA's driver) in several dispatches.
void record_matmul(const TensorImpl& a_in, const TensorImpl& b_in, bool ta, bool tb, const TensorImpl* bias,
                   uint32_t activation, TensorImpl& out, const char* op) {
    const int64_t k = ta ? a_in.ne[0] : a_in.ne[1];
    const MatmulKernel kernel = choose_matmul(a_in.dtype, out.ne[0], out.ne[1], k, out.ne[2] * out.ne[3]);
    if (is_half(a_in.dtype) != (kernel == MatmulKernel::coopmat) || a_in.dtype != b_in.dtype ||
        a_in.dtype != out.dtype)
        throw std::logic_error(std::string(op) + ": the GPU kernels multiply f32 by f32, or f16 by f16 (bf16 by bf16) "
                               "on cooperative matrices; got " + dtype_name(a_in.dtype) + " and " +
                               dtype_name(b_in.dtype));
    TensorPtr a_copy, b_copy;  // k-contiguous copies, where worth_transposing
    if (kernel == MatmulKernel::coopmat) {
        const int64_t work = size_mul(out.ne[0], out.ne[1], k);
        if (!ta && worth_transposing(a_in.ne[2] * a_in.ne[3], out.ne[1], work)) {
            a_copy = transposed_copy(a_in, op);  // [k, m]: op(A) is its transpose
            ta = true;
        }
        if (tb && worth_transposing(b_in.ne[2] * b_in.ne[3], out.ne[0], work)) {
            b_copy = transposed_copy(b_in, op);  // [k, n]: op(B) is itself
            tb = false;
        }
    }
    const TensorImpl& a = a_copy ? *a_copy : a_in;
    const TensorImpl& b = b_copy ? *b_copy : b_in;
    uint64_t tiles = 0;
    LinearPush linear{matmul_push(a, b, ta, tb, out, tile_shape(kernel), tiles), bias ? bias->address() : 0,
                      activation};
    std::vector<vk::Range> reads{span(a), span(b)};
    const uint32_t batches = u32(out.ne[2] * out.ne[3], op);
    if (kernel == MatmulKernel::tiled_small) {
        linear.matmul.split_k = u32(small_split_k(out.ne[0], out.ne[1], k, batches), op);
        if (linear.matmul.split_k < linear.matmul.k) {
            record_split_small(linear.matmul, bias, activation, batches, reads, out, op);
            return;
        }
    }
    if (bias) reads.push_back(span(*bias));
    const bool chunked_a = reads_in_chunks(a), chunked_b = reads_in_chunks(b);
    const std::string shader = matmul_shader(kernel, bias != nullptr, ta, tb, chunked_a && chunked_b, a.dtype);
    const uint32_t per_dispatch = ctx().limits().max_group_count_z;
    if (batches > per_dispatch && out.ne[3] != 1)
        throw std::invalid_argument(std::string(op) + ": " + std::to_string(batches) + " batched products along dims 2 "
                                    "and 3 exceed the " + std::to_string(per_dispatch) + " slices one GPU dispatch "
                                    "runs; put the batch in dim 2 alone (reshape)");
    for (uint32_t z0 = 0; z0 < batches; z0 += per_dispatch) {
        const uint32_t count = std::min(per_dispatch, batches - z0);
        LinearPush part = linear;
        if (count != batches) part.matmul = batch_slices(linear.matmul, z0, count, dtype_size(out.dtype));
        if (kernel == MatmulKernel::coopmat) {
            const CoopmatPush p{part.matmul, part.bias, part.activation,
                                uint32_t(chunked_a) | uint32_t(chunked_b) << 1};
            record(shader, p, tiles, reads, {span(out)}, count);
        } else if (bias) {
            record(shader, part, tiles, reads, {span(out)}, count);
        } else {
            record(shader, part.matmul, tiles, reads, {span(out)}, count);
        }
    }
}

}  // namespace

namespace vk {

bool takes_half(Op op, const Inputs& in) {
    if (op == Op::conv2d || op == Op::conv2d_input_back || op == Op::conv2d_weight_back)
        return conv2d_on_cooperative_matrices(in);
    if (op != Op::matmul && op != Op::linear) return false;
    const DType dtype = in.front()->dtype;
    const bool same = std::all_of(in.begin(), in.end(), [&](const TensorPtr& t) { return t->dtype == dtype; });
    return same && on_cooperative_matrices(dtype);
}

std::string matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t k, int64_t batch) {
    const MatmulKernel kernel = choose_matmul(dtype, m, n, k, batch);
#if defined(RLKIT_COOPMAT_KHR)
    const std::string extension = "VK_KHR_cooperative_matrix";
#else
    const std::string extension = "VK_NV_cooperative_matrix";
#endif
    if (kernel == MatmulKernel::coopmat) {
        // (an output of one slice has operands of one; A is copied where n is wide enough, op(B) where m is)
        const bool copies = worth_transposing(batch, std::max(m, n), size_mul(m, n, k));
        return "cooperative matrices (" + extension + "), 128x256 tiles of 16x16x16 " + dtype_name(dtype) +
               " fragments, f32 accumulation" +
               (copies ? ", an operand whose k is not contiguous read from a k-contiguous copy" : "");
    }
    const Tile tile = tile_shape(kernel);
    const std::string size = std::to_string(tile.rows) + "x" + std::to_string(tile.columns);
    const std::string widened = is_half(dtype) ? std::string(" (") + dtype_name(dtype) + " operands widened to f32)" : "";
    std::string split;
    if (kernel == MatmulKernel::tiled_small) {
        const int64_t slice = small_split_k(m, n, k, batch);
        if (slice < k) split = ", k split in " + std::to_string((k + slice - 1) / slice) + " slices of " + std::to_string(slice);
    }
    return "f32 SIMT, " + size + " tiles" + split + widened;
}

}  // namespace vk

void vk_matmul(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    record_matmul(*in[0], *in[1], attrs.ints[0] != 0, attrs.ints[1] != 0, nullptr, 0, out, "matmul");
}

// The product's kernel with relu_back's value as its epilogue where it is the 16 x 16 one unsplit
// (an RL network's layers, whose input gradients pass each hidden layer's relu_back: a dependency
// level each, of one elementwise kernel); otherwise the product, then relu_back on it.
void vk_matmul_relu_mask(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &a = *in[0], &b = *in[1], &y = *in[2];
    const bool ta = attrs.ints[0] != 0, tb = attrs.ints[1] != 0;
    const int64_t k = ta ? a.ne[0] : a.ne[1];
    const int64_t batches = out.ne[2] * out.ne[3];
    const MatmulKernel kernel = choose_matmul(a.dtype, out.ne[0], out.ne[1], k, batches);
    if (kernel == MatmulKernel::tiled_small && small_split_k(out.ne[0], out.ne[1], k, batches) >= k &&
        batches <= int64_t(ctx().limits().max_group_count_z)) {
        uint64_t tiles = 0;
        const MaskPush p{matmul_push(a, b, ta, tb, out, tile_shape(kernel), tiles), y.address()};
        record("matmul_small_relu_mask", p, tiles, {span(a), span(b), span(y)}, {span(out)},
               u32(batches, "matmul_relu_mask"));
        return;
    }
    TensorPtr product = make_on(Device::gpu, out.ne, out.ndim, DType::f32);
    record_matmul(a, b, ta, tb, nullptr, 0, *product, "matmul_relu_mask");
    vk_relu_back({product, in[2]}, {}, out);
}

void vk_linear(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    record_matmul(*in[0], *in[1], false, false, in[2].get(), uint32_t(attrs.ints[0]), out, "linear");
}

}  // namespace rk
