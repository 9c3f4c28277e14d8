// The Vulkan column of the op table: for each op, the shader variant it records and the push
// constants it passes (each struct mirrors the push_constant block of its shader, std430).
// The sequence ops (state-space layers, recurrences) are in vk_sequence_kernels.cpp.
#include <algorithm>
#include <cstring>

#include "backend.hpp"
#include "kernel_util.hpp"
#include "random.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"
#include "vulkan/vk_shaders.hpp"
#include "elementwise_chain.hpp"

namespace rk {

using vk::ctx;
using vk::device_table;
using vk::groups;
using vk::kGroup;
using vk::record;
using vk::shape4;
using vk::span;
using vk::u32;

namespace {

// ---- elementwise -----------------------------------------------------------------------

struct BinaryPush {
    uint64_t a, b, o;
    uint32_t ne[4], sa[4], sb[4];
    uint32_t n;
    float p0, p1;
};

void binary(const char* variant, const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &a = *in[0], &b = *in[1];
    BinaryPush p{a.address(), b.address(), out.address()};
    shape4(out.ne, p.ne, variant);
    const Shape sa = broadcast_strides(a, out.ne), sb = broadcast_strides(b, out.ne);
    for (int d = 0; d < kMaxDims; ++d) p.sa[d] = u32(sa[d], variant), p.sb[d] = u32(sb[d], variant);
    p.n = u32(out.numel(), variant);
    p.p0 = attrs.floats.size() > 0 ? float(attrs.floats[0]) : 0.0f;
    p.p1 = attrs.floats.size() > 1 ? float(attrs.floats[1]) : 0.0f;
    record(std::string("binary_") + variant, p, groups(p.n), {span(a), span(b)}, {span(out)});
}

struct UnaryPush {
    uint64_t x, o;
    uint32_t n;
    float p0, p1;
};

void unary(const char* variant, const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    UnaryPush p{in[0]->address(), out.address(), u32(out.numel(), variant)};
    p.p0 = attrs.floats.size() > 0 ? float(attrs.floats[0]) : 0.0f;
    p.p1 = attrs.floats.size() > 1 ? float(attrs.floats[1]) : 0.0f;
    record(std::string("unary_") + variant, p, groups(p.n), {span(*in[0])}, {span(out)});
}

struct CastPush {
    uint64_t x, o;
    uint32_t n;
};

void cast_into(const TensorImpl& x, TensorImpl& out) {
    if (x.dtype == out.dtype) {
        ctx().copy(x, out);
        return;
    }
    auto one_step = [](DType from, DType to) -> const char* {
        if (from == DType::f32 && to == DType::f16) return "cast_f32_to_f16";
        if (from == DType::f16 && to == DType::f32) return "cast_f16_to_f32";
        if (from == DType::f32 && to == DType::bf16) return "cast_f32_to_bf16";
        if (from == DType::bf16 && to == DType::f32) return "cast_bf16_to_f32";
        if (from == DType::f32 && to == DType::i32) return "cast_f32_to_i32";
        if (from == DType::i32 && to == DType::f32) return "cast_i32_to_f32";
        if (from == DType::u8 && to == DType::f32) return "cast_u8_to_f32";
        return nullptr;
    };
    if (out.dtype == DType::u8)
        throw TypeError("cast: converting to u8 on the GPU is not supported (u8 is a storage dtype for buffers)");
    if (const char* shader = one_step(x.dtype, out.dtype)) {
        CastPush p{x.address(), out.address(), u32(out.numel(), "cast")};
        const uint64_t threads = is_half(out.dtype) ? (out.numel() + 1) / 2 : out.numel();  // a word each
        record(shader, p, groups(threads), {span(x)}, {span(out)});
        return;
    }
    TensorPtr wide = make_on(Device::gpu, x.ne, x.ndim, DType::f32);  // the others (f16 <-> bf16, i32 -> f16...) go through f32
    cast_into(x, *wide);
    cast_into(*wide, out);
}

// ---- columns ---------------------------------------------------------------------------

struct ColumnsPush {
    uint64_t a, b, o;
    uint32_t rows, cols;
};

void columns(const char* variant, const TensorImpl& a, const TensorImpl* b, TensorImpl& out) {
    ColumnsPush p{a.address(), b ? b->address() : 0, out.address(), u32(a.ne[0], variant),
                  u32(n_columns(a), variant)};
    std::vector<vk::Range> reads{span(a)};
    if (b) reads.push_back(span(*b));
    record(std::string("columns_") + variant, p, p.cols, reads, {span(out)});
}

// ---- indexing --------------------------------------------------------------------------

struct IndexPush {
    uint64_t x, index, o;
    uint32_t rows, limit, n_index, total;
};

void index_op(const char* variant, const TensorImpl* x, const TensorImpl& index, TensorImpl& out, int64_t rows,
              int64_t limit) {
    IndexPush p{x ? x->address() : 0, index.address(), out.address(), u32(rows, variant), u32(limit, variant),
                u32(index.numel(), variant), u32(out.numel(), variant)};
    std::vector<vk::Range> reads{span(index)};
    if (x) reads.push_back(span(*x));
    record(std::string("index_") + variant, p, groups(p.total), reads, {span(out)});
}

struct RowsPush {
    uint64_t x, o;
    uint32_t x_rows, out_rows, src0, dst0, n, zero_outside, total;
};

void rows_window(const TensorImpl& x, TensorImpl& out, int64_t src0, int64_t dst0, int64_t n, bool zero_outside) {
    RowsPush p{x.address(), out.address(), u32(x.ne[0], "rows"), u32(out.ne[0], "rows"), u32(src0, "rows"),
               u32(dst0, "rows"), u32(n, "rows"), zero_outside ? 1u : 0u, u32(out.numel(), "rows")};
    record("rows", p, groups(p.total), {span(x)}, {span(out)});
}

struct RandomPush {
    uint64_t x, o;  // x: sample_categorical's logits, randint's high
    uint64_t stream;
    uint32_t n, rows;
    uint64_t stream_at;  // where to read the stream instead (a recorded program's slot), or 0
    float below;         // rand's cap (largest_below_one of the dtype the result is rounded to)
};

// A random op's stream: drawn now when the op runs; while a program records its command buffer,
// read at every replay from a slot the host fills with a fresh draw before each submission.
void random_op(const char* shader, RandomPush p, std::vector<vk::Range> reads, const TensorImpl& out) {
    p.stream_at = ctx().take_stream_slot();
    if (p.stream_at)
        reads.push_back({p.stream_at, p.stream_at + sizeof(uint64_t)});
    else
        p.stream = next_stream();
    record(shader, p, groups(p.n), reads, {span(out)});
}

}  // namespace

// The elementwise ops (native/elementwise.def): each records its own variant of binary.comp
// (binary ops and backward helpers) or unary.comp, which shaders/variants.cmake makes from the
// same list (an entry it could not read fails here).
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value)                                                   \
    static_assert(vk::has_shader_variant(ElementwiseKind::kind == ElementwiseKind::unary ? "unary_" #name           \
                                                                                         : "binary_" #name),        \
                  "no shader variant of the elementwise op " #name " (shaders/variants.cmake reads "            \
                  "native/elementwise.def: is its entry on one line, at the start of it?)");                     \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {                                      \
        if constexpr (ElementwiseKind::kind == ElementwiseKind::unary)                                             \
            unary(#name, in, attrs, out);                                                                          \
        else                                                                                                       \
            binary(#name, in, attrs, out);                                                                         \
    }
#include "elementwise.def"
#undef RK_ELEMENTWISE

void vk_cast(const Inputs& in, const OpAttrs&, TensorImpl& out) { cast_into(*in[0], out); }

namespace {

struct ChainStepRecord {  // chain.comp's Step (std430: 20 bytes)
    uint32_t op;
    int32_t a, b;
    float p0, p1;
};
static_assert(sizeof(ChainStepRecord) == 20, "chain.comp reads steps of 20 bytes");

struct ChainPush {
    uint64_t inputs[kMaxChainInputs];
    uint64_t o, steps;
    uint32_t n, n_steps, scalar_mask;
};

}  // namespace

// The steps go into a table the kernel reads (written into the command buffer, as the
// optimizers' tables are); each invocation runs the whole chain on one element.
void vk_elementwise_chain(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    std::vector<ChainStepRecord> records;
    for (const ChainStep& step : chain_steps(attrs))
        records.push_back({elementwise_op(step.op)->code, step.a, step.b, step.p0, step.p1});
    TensorPtr table = device_table(records);
    ChainPush p{};
    std::vector<vk::Range> reads{span(*table)};
    for (size_t k = 0; k < in.size(); ++k) {
        p.inputs[k] = in[k]->address();
        if (in[k]->numel() == 1 && out.numel() != 1) p.scalar_mask |= 1u << k;
        reads.push_back(span(*in[k]));
    }
    p.o = out.address();
    p.steps = table->address();
    p.n = u32(out.numel(), "elementwise_chain");
    p.n_steps = uint32_t(records.size());
    record("elementwise_chain", p, groups(p.n), reads, {span(out)});
}

namespace {

struct MatmulPush {
    uint64_t a, b, c;
    uint32_t m, n, k, lda, ldb, ta, tb, ne2, sa2, sa3, sb2, sb3, groups_m;
};

// The linear op's push constants: matmul's, then its bias and activation.
struct LinearPush {
    MatmulPush matmul;
    uint64_t bias;
    uint32_t activation;
};

// matmul_coopmat.comp's: the linear op's (bias unused by plain matmul), then which operands may be
// read in whole 16-byte chunks.
struct CoopmatPush {
    LinearPush linear;
    uint32_t chunked;
};

// The matmul kernel for a product: cooperative matrices for f16 or bf16 where the device has them
// for that dtype, else the f32 SIMT kernel (16-bit operands widened first) with the largest tiles
// the output has enough of: 128 x 128 where that keeps a large GPU busy, 64 x 64, and 16 x 16 for
// outputs that make fewer than kSmallTilesBelow 64 x 64 tiles (the layers of an RL network at a
// small batch).
enum class MatmulKernel { tiled_small, tiled, tiled_large, coopmat };

constexpr uint64_t kLargeTilesWanted = 128;  // about one per multiprocessor of a large GPU (the H200 has 132)
constexpr uint64_t kSmallTilesBelow = 32;    // a quarter of those: too few to spread k's work

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

MatmulKernel choose_matmul(DType dtype, int64_t m, int64_t n, int64_t batch) {
    if (on_cooperative_matrices(dtype)) return MatmulKernel::coopmat;
    if (tile_count(MatmulKernel::tiled_large, m, n, batch) >= kLargeTilesWanted) return MatmulKernel::tiled_large;
    return tile_count(MatmulKernel::tiled, m, n, batch) >= kSmallTilesBelow ? MatmulKernel::tiled
                                                                            : MatmulKernel::tiled_small;
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
    p.m = u32(out.ne[0], "matmul");
    p.n = u32(out.ne[1], "matmul");
    p.k = u32(ta ? a.ne[0] : a.ne[1], "matmul");
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

// Records act(op(A) @ op(B) + bias) (no bias or activation when bias is null) with the kernel the
// dtype, device and shape call for.
void record_matmul(const TensorImpl& a, const TensorImpl& b, bool ta, bool tb, const TensorImpl* bias,
                   uint32_t activation, TensorImpl& out, const char* op) {
    const MatmulKernel kernel = choose_matmul(a.dtype, out.ne[0], out.ne[1], out.ne[2] * out.ne[3]);
    if (is_half(a.dtype) != (kernel == MatmulKernel::coopmat) || a.dtype != b.dtype || a.dtype != out.dtype)
        throw std::logic_error(std::string(op) + ": the GPU kernels multiply f32 by f32, or f16 by f16 (bf16 by bf16) "
                               "on cooperative matrices; got " + dtype_name(a.dtype) + " and " + dtype_name(b.dtype));
    uint64_t tiles = 0;
    const LinearPush linear{matmul_push(a, b, ta, tb, out, tile_shape(kernel), tiles), bias ? bias->address() : 0,
                            activation};
    std::vector<vk::Range> reads{span(a), span(b)};
    if (bias) reads.push_back(span(*bias));
    const uint32_t batches = u32(out.ne[2] * out.ne[3], op);
    const bool chunked_a = reads_in_chunks(a), chunked_b = reads_in_chunks(b);
    const std::string shader = matmul_shader(kernel, bias != nullptr, ta, tb, chunked_a && chunked_b, a.dtype);
    if (kernel == MatmulKernel::coopmat) {
        const CoopmatPush p{linear, uint32_t(chunked_a) | uint32_t(chunked_b) << 1};
        record(shader, p, tiles, reads, {span(out)}, batches);
    } else if (bias) {
        record(shader, linear, tiles, reads, {span(out)}, batches);
    } else {
        record(shader, linear.matmul, tiles, reads, {span(out)}, batches);
    }
}

}  // namespace

namespace vk {

bool takes_half(Op op, const Inputs& in) {
    if (op != Op::matmul && op != Op::linear) return false;
    const DType dtype = in.front()->dtype;
    const bool same = std::all_of(in.begin(), in.end(), [&](const TensorPtr& t) { return t->dtype == dtype; });
    return same && on_cooperative_matrices(dtype);
}

std::string matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t batch) {
    const MatmulKernel kernel = choose_matmul(dtype, m, n, batch);
#if defined(RLKIT_COOPMAT_KHR)
    const std::string extension = "VK_KHR_cooperative_matrix";
#else
    const std::string extension = "VK_NV_cooperative_matrix";
#endif
    if (kernel == MatmulKernel::coopmat)
        return "cooperative matrices (" + extension + "), 128x256 tiles of 16x16x16 " + dtype_name(dtype) +
               " fragments, f32 accumulation";
    const Tile tile = tile_shape(kernel);
    const std::string size = std::to_string(tile.rows) + "x" + std::to_string(tile.columns);
    const std::string widened = is_half(dtype) ? std::string(" (") + dtype_name(dtype) + " operands widened to f32)" : "";
    return "f32 SIMT, " + size + " tiles" + widened;
}

}  // namespace vk

void vk_matmul(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    record_matmul(*in[0], *in[1], attrs.ints[0] != 0, attrs.ints[1] != 0, nullptr, 0, out, "matmul");
}

void vk_linear(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    record_matmul(*in[0], *in[1], false, false, in[2].get(), uint32_t(attrs.ints[0]), out, "linear");
}

struct SumToPush {
    uint64_t x, o;
    uint32_t xne[4], one[4];
    uint32_t n_out, n_reduced;
};

void vk_sum_to(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    SumToPush p{x.address(), out.address()};
    shape4(x.ne, p.xne, "sum_to");
    shape4(out.ne, p.one, "sum_to");
    p.n_out = u32(out.numel(), "sum_to");
    p.n_reduced = u32(x.numel() / out.numel(), "sum_to");
    record("sum_to", p, p.n_out, {span(x)}, {span(out)});
}

struct ExpandPush {
    uint64_t x, o;
    uint32_t ne[4], sx[4];
    uint32_t n;
};

void vk_expand(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    ExpandPush p{x.address(), out.address()};
    shape4(out.ne, p.ne, "expand");
    const Shape sx = broadcast_strides(x, out.ne);
    for (int d = 0; d < kMaxDims; ++d) p.sx[d] = u32(sx[d], "expand");
    p.n = u32(out.numel(), "expand");
    record("expand", p, groups(p.n), {span(x)}, {span(out)});
}

void vk_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("softmax", *in[0], nullptr, out); }
void vk_log_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("log_softmax", *in[0], nullptr, out); }
void vk_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("softmax_back", *in[0], in[1].get(), out); }
void vk_log_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    columns("log_softmax_back", *in[0], in[1].get(), out);
}
void vk_max(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("max", *in[0], nullptr, out); }
void vk_argmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("argmax", *in[0], nullptr, out); }

void vk_softmax_cross_entropy(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    ColumnsPush p{in[0]->address(), in[1]->address(), out.address(), u32(in[0]->ne[0], "softmax_cross_entropy"),
                  u32(n_columns(*in[0]), "softmax_cross_entropy")};
    record("softmax_cross_entropy", p, 1, {span(*in[0]), span(*in[1])}, {span(out)});
}

struct TransposePush {
    uint64_t x, o;
    uint32_t rows, cols, n;
};

void vk_transpose(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    TransposePush p{x.address(), out.address(), u32(x.ne[0], "transpose"), u32(x.ne[1], "transpose"),
                    u32(x.numel(), "transpose")};
    record("transpose", p, groups(p.n), {span(x)}, {span(out)});
}

void vk_reshape(const Inputs& in, const OpAttrs&, TensorImpl& out) { ctx().copy(*in[0], out); }

void vk_slice_rows(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    rows_window(*in[0], out, attrs.ints[0], 0, out.ne[0], true);
}

void vk_pad_rows(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    rows_window(*in[0], out, 0, attrs.ints[0], in[0]->ne[0], true);
}

void vk_concat_rows(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    rows_window(*in[0], out, 0, 0, in[0]->ne[0], false);
    rows_window(*in[1], out, 0, in[0]->ne[0], in[1]->ne[0], false);
}

void vk_gather(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    index_op("gather", in[0].get(), *in[1], out, in[0]->ne[0], in[0]->ne[0]);
}

void vk_one_hot(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    index_op("one_hot", nullptr, *in[0], out, attrs.ints[0], attrs.ints[0]);
}

void vk_get_rows(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    // Columns move as 32-bit words: a u8 column of 4k bytes is k words.
    const int64_t words_per_column = x.dtype == DType::u8 ? x.ne[0] / 4 : x.ne[0];
    index_op("get_rows", &x, *in[1], out, words_per_column, x.ne[1]);
}

void vk_scatter_cols(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    index_op("scatter_cols", in[0].get(), *in[1], out, in[0]->ne[0], attrs.ints[0]);
}

struct PrefixPush {
    uint64_t a, b, o;
    uint32_t rows, n;
};

void vk_cumsum(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    PrefixPush p{x.address(), 0, out.address(), u32(x.ne[0], "cumsum"), u32(n_columns(x), "cumsum")};
    record("prefix_cumsum", p, p.n, {span(x)}, {span(out)});
}

void vk_searchsorted(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &sorted = *in[0], &query = *in[1];
    PrefixPush p{sorted.address(), query.address(), out.address(), u32(sorted.ne[0], "searchsorted"),
                 u32(query.numel(), "searchsorted")};
    record("prefix_searchsorted", p, groups(p.n), {span(sorted), span(query)}, {span(out)});
}

void vk_put_cols(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &x = *in[0], &index = *in[1], &values = *in[2];
    // the values play "x" and the target plays "o" in index.comp
    IndexPush p{values.address(), index.address(), x.address(), u32(x.ne[0], "put_cols"), u32(x.ne[1], "put_cols"),
                u32(index.numel(), "put_cols"), u32(x.ne[0], "put_cols")};
    record("index_put_cols", p, groups(p.total), {span(values), span(index), span(x)}, {span(x)});
    ctx().fill(out, 0u);
}

void vk_full(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    const double value = attrs.floats[0];
    uint32_t pattern;
    if (out.dtype == DType::i32) {
        const int32_t v = int32_t(value);
        std::memcpy(&pattern, &v, 4);
    } else if (out.dtype == DType::u8) {
        pattern = uint32_t(std::clamp(value, 0.0, 255.0)) * 0x01010101u;  // the byte in all four lanes
    } else {
        const float v = float(value);
        std::memcpy(&pattern, &v, 4);
    }
    ctx().fill(out, pattern);
}

void vk_rand(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    // out is f32 here; an f16 or bf16 result is rounded from it afterwards (op_table.cpp)
    const float below = largest_below_one(DType(attrs.ints[kMaxDims + 1]));
    random_op("random_rand", RandomPush{0, out.address(), 0, u32(out.numel(), "rand"), 1, 0, below}, {}, out);
}

void vk_randn(const Inputs&, const OpAttrs&, TensorImpl& out) {
    random_op("random_randn", RandomPush{0, out.address(), 0, u32(out.numel(), "randn"), 1}, {}, out);
}

void vk_randint(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& high = *in[0];
    random_op("random_randint", RandomPush{high.address(), out.address(), 0, u32(out.numel(), "randint"), 1},
              {span(high)}, out);
}

void vk_sample_categorical(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& logits = *in[0];
    RandomPush p{logits.address(), out.address(), 0, u32(out.numel(), "sample_categorical"),
                 u32(logits.ne[0], "sample_categorical")};
    random_op("random_sample_categorical", p, {span(logits)}, out);
}

// ---- optimizer updates ------------------------------------------------------------------
//
// One dispatch updates a whole parameter set: the host cuts each parameter's elements into
// chunks of kUpdateChunk and writes one record per chunk (the four tensors' addresses and the
// chunk's elements) into a table the dispatch reads by address; workgroup i updates chunk i.
// The table is written into the command buffer (Context::write), so a recorded program carries
// its own, made from the addresses it was recorded with (a moved tensor re-records it).

namespace {

constexpr int64_t kUpdateChunk = 4 * kGroup;  // elements per workgroup: 4 per invocation

// Calls add(begin, count) for each kUpdateChunk-element chunk of a tensor of n elements.
template <typename Add>
void for_each_chunk(int64_t n, const Add& add) {
    for (int64_t begin = 0; begin < n; begin += kUpdateChunk)
        add(uint32_t(begin), uint32_t(std::min(kUpdateChunk, n - begin)));
}

struct UpdateChunk {  // optim.comp's Chunk (std430: 40 bytes)
    uint64_t w, g, m, v;
    uint32_t begin, count;
};
static_assert(sizeof(UpdateChunk) == 40, "optim.comp reads records of 40 bytes");

struct OptimPush {
    uint64_t table, hyper, scale;  // hyper, scale: a captured step's buffers (else 0)
    uint32_t n_chunks;
    float c[7];  // an eager step's coefficients (the order of the hyper tensor)
};

// Records the update of `set` by `shader`; hyper and scale are null for an eager step.
void update_parameters(const char* shader, const UpdateSet& set, OptimPush push, const TensorImpl* hyper,
                       const TensorImpl* scale) {
    std::vector<UpdateChunk> chunks;
    std::vector<vk::Range> reads, writes;
    for (const UpdateTensors& u : set) {
        for_each_chunk(u32(u.w->numel(), shader), [&](uint32_t begin, uint32_t count) {
            chunks.push_back({u.w->address(), u.g->address(), u.m->address(), u.v->address(), begin, count});
        });
        reads.insert(reads.end(), {span(*u.w), span(*u.g), span(*u.m), span(*u.v)});
        writes.insert(writes.end(), {span(*u.w), span(*u.m), span(*u.v)});
    }
    if (chunks.empty()) return;
    if (hyper) reads.insert(reads.end(), {span(*hyper), span(*scale)});
    TensorPtr table = device_table(chunks);
    reads.push_back(span(*table));
    push.table = table->address();
    push.hyper = hyper ? hyper->address() : 0;
    push.scale = scale ? scale->address() : 0;
    push.n_chunks = u32(int64_t(chunks.size()), shader);
    record(shader, push, chunks.size(), reads, writes);
}

}  // namespace

namespace vk {

void adam(const UpdateSet& set, const AdamCoefficients& c) {
    OptimPush p{};
    const double coefficients[7] = {c.beta1, c.beta2, c.eps, c.coupled_wd, c.decay, c.step, c.inv_bc2};
    for (int k = 0; k < 7; ++k) p.c[k] = float(coefficients[k]);
    update_parameters("optim_adam", set, p, nullptr, nullptr);
}

void sgd(const UpdateSet& set, const SgdCoefficients& c) {
    OptimPush p{};
    p.c[0] = float(c.momentum);
    p.c[1] = float(c.weight_decay);
    p.c[2] = float(c.lr);
    update_parameters("optim_sgd", set, p, nullptr, nullptr);
}

}  // namespace vk

void vk_adam_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    update_parameters("optim_adam_step", captured_update_set(in, true), OptimPush{}, in[0].get(), in[1].get());
    ctx().copy(*in[1], out);
}

void vk_sgd_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    update_parameters("optim_sgd_step", captured_update_set(in, false), OptimPush{}, in[0].get(), in[1].get());
    ctx().copy(*in[1], out);
}

void vk_polyak_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    OptimPush p{};
    p.c[0] = float(attrs.floats[0]);
    update_parameters("optim_polyak", polyak_set(in), p, nullptr, nullptr);
    ctx().fill(out, 0);
}

void vk_cast_into(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    for (size_t at = 0; at < in.size(); at += 2) cast_into(*in[at + 1], *in[at]);
    ctx().fill(out, 0);
}

// ---- the sum of squares of a tensor set (a gradient norm) --------------------------------------

namespace {

struct NormChunk {  // norm.comp's Chunk (std430: 16 bytes)
    uint64_t x;
    uint32_t begin, count;
};
static_assert(sizeof(NormChunk) == 16, "norm.comp reads records of 16 bytes");

struct NormPush {
    uint64_t table, partials, o;
    uint32_t n_chunks;
};

}  // namespace

void vk_sum_squares(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    std::vector<NormChunk> chunks;
    std::vector<vk::Range> reads;
    for (const TensorPtr& x : in) {
        for_each_chunk(u32(x->numel(), "sum_squares"),
                       [&](uint32_t begin, uint32_t count) { chunks.push_back({x->address(), begin, count}); });
        reads.push_back(span(*x));
    }
    TensorPtr table = device_table(chunks);
    TensorPtr partials = make_on(Device::gpu, {int64_t(chunks.size()), 1, 1, 1}, 2, DType::f32);  // [n_chunks, 1]
    reads.push_back(span(*table));
    NormPush p{table->address(), partials->address(), out.address(), u32(int64_t(chunks.size()), "sum_squares")};
    record("norm_partials", p, chunks.size(), reads, {span(*partials)});
    record("norm_total", p, 1, {span(*partials)}, {span(out)});
}

}  // namespace rk
