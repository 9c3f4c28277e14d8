// The Vulkan column of the op table: for each op, the shader variant it records and the push
// constants it passes (each struct mirrors the push_constant block of its shader, std430).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "backend.hpp"
#include "kernel_util.hpp"
#include "random.hpp"
#include "recurrence.hpp"
#include "ssm_scan.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"
#include "elementwise_chain.hpp"

namespace rk {
namespace {

constexpr uint64_t kGroup = 256;  // local_size_x of every shader

vk::Context& ctx() {
    std::string why;
    vk::Context* c = vk::Context::get(&why);
    if (!c) throw std::runtime_error("no GPU: " + why);
    return *c;
}

uint64_t groups(uint64_t n) { return (n + kGroup - 1) / kGroup; }

vk::Range span(const TensorImpl& t) { return {t.address(), t.address() + (t.nbytes() + 3) / 4 * 4}; }

uint32_t u32(int64_t n, const char* what) {
    if (n < 0 || n > int64_t(UINT32_MAX))
        throw std::invalid_argument(std::string(what) + ": a size exceeds the GPU kernels' 32-bit indexing");
    return uint32_t(n);
}

void shape4(const Shape& ne, uint32_t out[4], const char* what) {
    for (int d = 0; d < kMaxDims; ++d) out[d] = u32(ne[d], what);
}

template <typename Push>
void record(const std::string& shader, const Push& push, uint64_t n_groups, std::vector<vk::Range> reads,
            std::vector<vk::Range> writes, uint32_t groups_z = 1) {
    static_assert(sizeof(Push) <= 128, "push constants are limited to 128 bytes");
    ctx().dispatch(shader, &push, sizeof(Push), n_groups, reads, writes, groups_z);
}

// A u8 tensor holding `records`, written into the command buffer (a recorded program carries
// its own copy): the tables of chunks and steps that kernels read by address.
template <typename Record>
TensorPtr device_table(const std::vector<Record>& records) {
    const uint64_t bytes = records.size() * sizeof(Record);
    TensorPtr table = make_on(Device::gpu, {int64_t(bytes), 1, 1, 1}, 2, DType::u8);
    ctx().write(*table, records.data(), bytes);
    return table;
}

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
        if (from == DType::f32 && to == DType::i32) return "cast_f32_to_i32";
        if (from == DType::i32 && to == DType::f32) return "cast_i32_to_f32";
        if (from == DType::u8 && to == DType::f32) return "cast_u8_to_f32";
        return nullptr;
    };
    if (out.dtype == DType::u8)
        throw TypeError("cast: converting to u8 on the GPU is not supported (u8 is a storage dtype for buffers)");
    if (const char* shader = one_step(x.dtype, out.dtype)) {
        CastPush p{x.address(), out.address(), u32(out.numel(), "cast")};
        const uint64_t threads = out.dtype == DType::f16 ? (out.numel() + 1) / 2 : out.numel();
        record(shader, p, groups(threads), {span(x)}, {span(out)});
        return;
    }
    TensorPtr wide = make_on(Device::gpu, x.ne, x.ndim, DType::f32);  // i32 / u8 <-> f16 goes through f32
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

#define RK_VK_BINARY(name) \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) { binary(#name, in, attrs, out); }
RK_VK_BINARY(add)
RK_VK_BINARY(sub)
RK_VK_BINARY(mul)
RK_VK_BINARY(div)
RK_VK_BINARY(minimum)
RK_VK_BINARY(maximum)
RK_VK_BINARY(ge)
RK_VK_BINARY(gt)
RK_VK_BINARY(relu_back)
RK_VK_BINARY(sigmoid_back)
RK_VK_BINARY(tanh_back)
RK_VK_BINARY(silu_back)
RK_VK_BINARY(clamp_back)
#undef RK_VK_BINARY

#define RK_VK_UNARY(name) \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) { unary(#name, in, attrs, out); }
RK_VK_UNARY(neg)
RK_VK_UNARY(relu)
RK_VK_UNARY(sigmoid)
RK_VK_UNARY(tanh)
RK_VK_UNARY(softplus)
RK_VK_UNARY(silu)
RK_VK_UNARY(exp)
RK_VK_UNARY(log)
RK_VK_UNARY(sqrt)
RK_VK_UNARY(square)
RK_VK_UNARY(abs)
RK_VK_UNARY(sign)
RK_VK_UNARY(scale)
RK_VK_UNARY(pow)
RK_VK_UNARY(clamp)
RK_VK_UNARY(huber)
#undef RK_VK_UNARY

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
        records.push_back({chain_op(step.op)->code, step.a, step.b, step.p0, step.p1});
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

// The matmul kernel for a product: cooperative matrices for f16 where the device has them, else
// the f32 SIMT kernel (f16 operands widened first) with the largest tiles the output has enough
// of: 128 x 128 where that keeps a large GPU busy, 64 x 64, and 16 x 16 for outputs that make
// fewer than kSmallTilesBelow 64 x 64 tiles (the layers of an RL network at a small batch).
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

MatmulKernel choose_matmul(DType dtype, int64_t m, int64_t n, int64_t batch) {
    if (dtype == DType::f16 && ctx().limits().cooperative_matrix_f16) return MatmulKernel::coopmat;
    if (tile_count(MatmulKernel::tiled_large, m, n, batch) >= kLargeTilesWanted) return MatmulKernel::tiled_large;
    return tile_count(MatmulKernel::tiled, m, n, batch) >= kSmallTilesBelow ? MatmulKernel::tiled
                                                                            : MatmulKernel::tiled_small;
}

// The shader variant of a kernel: matmul.comp's or matmul_coopmat.comp's, plain or LINEAR; the
// cooperative-matrix kernel has one per transpose (its shared-memory layouts are fixed at compile time).
std::string matmul_shader(MatmulKernel kernel, bool linear, bool ta, bool tb) {
    const std::string base = linear ? "matmul_linear" : "matmul";
    switch (kernel) {
        case MatmulKernel::tiled_small: return base + "_small";
        case MatmulKernel::tiled: return base;
        case MatmulKernel::tiled_large: return base + "_large";
        case MatmulKernel::coopmat: return base + "_coopmat" + (ta ? "_ta" : "") + (tb ? "_tb" : "");
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

// Whether an f16 operand can be read in 16-byte chunks: 16-byte aligned, and its leading
// dimension (hence every column and batch slice) a multiple of 8 halves.
bool reads_in_chunks(const TensorImpl& t) { return t.address() % 16 == 0 && t.ne[0] % 8 == 0; }

// Records act(op(A) @ op(B) + bias) (no bias or activation when bias is null) with the kernel the
// dtype, device and shape call for.
void record_matmul(const TensorImpl& a, const TensorImpl& b, bool ta, bool tb, const TensorImpl* bias,
                   uint32_t activation, TensorImpl& out, const char* op) {
    const MatmulKernel kernel = choose_matmul(a.dtype, out.ne[0], out.ne[1], out.ne[2] * out.ne[3]);
    if ((a.dtype == DType::f16) != (kernel == MatmulKernel::coopmat) || a.dtype != b.dtype || a.dtype != out.dtype)
        throw std::logic_error(std::string(op) + ": the GPU kernels multiply f32 by f32, or f16 by f16 on cooperative "
                               "matrices; got " + dtype_name(a.dtype) + " and " + dtype_name(b.dtype));
    uint64_t tiles = 0;
    const LinearPush linear{matmul_push(a, b, ta, tb, out, tile_shape(kernel), tiles), bias ? bias->address() : 0,
                            activation};
    std::vector<vk::Range> reads{span(a), span(b)};
    if (bias) reads.push_back(span(*bias));
    const std::string shader = matmul_shader(kernel, bias != nullptr, ta, tb);
    const uint32_t batches = u32(out.ne[2] * out.ne[3], op);
    if (kernel == MatmulKernel::coopmat) {
        const CoopmatPush p{linear, uint32_t(reads_in_chunks(a)) | uint32_t(reads_in_chunks(b)) << 1};
        record(shader, p, tiles, reads, {span(out)}, batches);
    } else if (bias) {
        record(shader, linear, tiles, reads, {span(out)}, batches);
    } else {
        record(shader, linear.matmul, tiles, reads, {span(out)}, batches);
    }
}

}  // namespace

namespace vk {

bool takes_f16(Op op, const Inputs& in) {
    if (op != Op::matmul && op != Op::linear) return false;
    const bool all_f16 = std::all_of(in.begin(), in.end(), [](const TensorPtr& t) { return t->dtype == DType::f16; });
    return all_f16 && ctx().limits().cooperative_matrix_f16;
}

std::string matmul_kernel(DType dtype, int64_t m, int64_t n, int64_t batch) {
    const MatmulKernel kernel = choose_matmul(dtype, m, n, batch);
#if defined(RLKIT_COOPMAT_KHR)
    const std::string extension = "VK_KHR_cooperative_matrix";
#else
    const std::string extension = "VK_NV_cooperative_matrix";
#endif
    if (kernel == MatmulKernel::coopmat)
        return "cooperative matrices (" + extension + "), 128x256 tiles of 16x16x16 f16 fragments, f32 accumulation";
    const Tile tile = tile_shape(kernel);
    const std::string size = std::to_string(tile.rows) + "x" + std::to_string(tile.columns);
    const std::string widened = dtype == DType::f16 ? " (f16 operands widened to f32)" : "";
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

void vk_rand(const Inputs&, const OpAttrs&, TensorImpl& out) {
    random_op("random_rand", RandomPush{0, out.address(), 0, u32(out.numel(), "rand"), 1}, {}, out);
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

// The counts of loops in the recurrences' shaders below come from reading them; lavapipe was
// seen to count about 1.2 times as many (rwkv_wkv7 at head size 64 went wrong from about 950
// tokens, where 59 per token were counted), so they are doubled.
constexpr double kLoopMargin = 2.0;

// Refuses a dispatch whose invocations would run more loop iterations than the device lets a
// shader invocation run before it ends its loops early (lavapipe: Limits::loop_iterations), which
// would give wrong numbers without an error. `iterations` bounds one invocation's from above.
void check_loop_budget(const char* op, int64_t tokens, double iterations) {
    const uint64_t budget = ctx().limits().loop_iterations;
    if (budget == 0 || iterations <= double(budget)) return;
    throw std::runtime_error(std::string(op) + ": " + std::to_string(tokens) + " tokens per sequence need about " +
                             std::to_string(int64_t(iterations)) + " loop iterations in one shader invocation; " +
                             ctx().device_name() + " ends a shader's loops after " + std::to_string(budget) +
                             " and would give wrong numbers. Run it on the CPU (rc.device('cpu')), or in shorter "
                             "pieces carrying the state");
}

// ---- state-space layers ------------------------------------------------------------------

struct SsmConvPush {
    uint64_t a, b, o;
    uint32_t d_conv, d_inner, n_t, n_s, n;
};

// ssm_conv and its backward helpers: (a, b) as ssm_conv.comp names them, dims from the output's
// shape rule (the CPU kernels check the same shapes).
void ssm_conv_op(const char* variant, const TensorImpl& a, const TensorImpl& b, TensorImpl& out, int64_t d_conv,
                 int64_t d_inner, int64_t n_t, int64_t n_s) {
    SsmConvPush p{a.address(), b.address(), out.address(), u32(d_conv, variant), u32(d_inner, variant),
                  u32(n_t, variant), u32(n_s, variant), u32(out.numel(), variant)};
    record(std::string("ssm_conv_") + variant, p, groups(p.n), {span(a), span(b)}, {span(out)});
}

void vk_ssm_conv(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &sx = *in[0], &c = *in[1];  // out [d_inner, n_t, n_s]
    ssm_conv_op("forward", sx, c, out, c.ne[0], c.ne[1], out.ne[1], out.ne[2]);
}

void vk_ssm_conv_sx_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &c = *in[1];
    ssm_conv_op("back_sx", g, c, out, c.ne[0], g.ne[0], g.ne[1], g.ne[2]);
}

void vk_ssm_conv_c_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &sx = *in[1];
    ssm_conv_op("back_c", g, sx, out, out.ne[0], g.ne[0], g.ne[1], g.ne[2]);
}

uint64_t next_pow2(uint64_t n) {
    uint64_t p = 1;
    while (p < n) p *= 2;
    return p;
}

struct SsmScanPush {
    uint64_t s, x, dt, a, b, c, ids, g, o;
    uint32_t d_state, head_dim, n_head, n_tok, n_seqs, n_group, a_rows, n_rs;
    uint32_t chunk;        // tokens between the backward pass's checkpoints (tiled forward: per stage)
    uint32_t split[2];     // ssm_scan.comp: lanes, slot_shift; ssm_scan_tiled.comp: n_blocks, p_blocks
    uint32_t scratch_stride;  // ssm_scan_tiled.comp's backward: scratch floats per (sequence, head)
};

// ssm_scan_rows.comp (forward): two rows per subgroup, each lane with LANE_STATES states of
// them, a variant for each power of two up to 32.
constexpr int64_t kRowsPerSubgroup = 2, kMaxLaneStates = 32;

// The forward variant's states per lane, or 0 where ssm_scan_rows.comp cannot run.
int64_t lane_states(const ScanDims& d) {
    const vk::Limits& limits = ctx().limits();
    const uint32_t lanes = limits.subgroup_size;
    if (!limits.subgroup_arithmetic || lanes == 0 || kGroup % lanes != 0) return 0;
    const int64_t states = int64_t(next_pow2(uint64_t((d.d_state + lanes - 1) / lanes)));
    return states <= kMaxLaneStates ? states : 0;
}

// ssm_scan_tiled.comp's tiles and stages (the shader's constants): 4 states of 8 rows per
// invocation; a token's B, C, x, dy and dt take at most 512 floats of a stage (2048 floats, or
// 5888 in the LARGE_STAGE variant, for 48 KiB of shared memory); 2560 floats of row sums.
constexpr int64_t kStageWidth = 512, kBackwardStates = 4, kBackwardRows = 8, kRowSums = 2560;
constexpr int64_t kSmallStage = 2048, kSmallStageTokens = 8, kLargeStage = 5888, kLargeStageTokens = 24;

struct TiledScan {
    bool fits;
    int64_t n_blocks, p_blocks, chunk;  // the push constants of those names
    bool large_stage;
};

// The backward pass checkpoints every chunk-th token in the scratch the CPU's layout sets aside
// (ScanDims::scratch_per_task): as many checkpoints as it holds, so chunks are short.
TiledScan tiled_backward(const ScanDims& d) {
    const int64_t group = int64_t(kGroup);
    const int64_t n_blocks = (d.d_state + kBackwardStates - 1) / kBackwardStates;
    const int64_t p_blocks = (d.head_dim + kBackwardRows - 1) / kBackwardRows;
    const int64_t slots = d.scratch_per_task() / d.state_size(), chunk = (d.n_tok + slots - 1) / slots;
    const bool large = ctx().limits().max_shared_memory >= 48 * 1024;
    const int64_t width = 2 * (d.d_state + d.head_dim + 1);  // B, C, x, dy, dt and its slope
    const bool fits = d.head_dim >= 8 && n_blocks * p_blocks <= group &&
                      p_blocks * kBackwardRows * (n_blocks + 1) <= kRowSums &&
                      width <= kStageWidth;
    return {fits, n_blocks, p_blocks, chunk, large};
}

// At least the loop iterations one invocation of the scan's shader runs: its loops whose trip
// counts are not constants, per token, from each shader's code. Generous, so that it errs on
// the side of refusing.
double scan_loop_iterations(const ScanDims& d, const std::string& shader) {
    const double tokens = double(d.n_tok);
    if (shader.rfind("ssm_scan_rows", 0) == 0) return tokens + 1;  // the token loop
    if (shader.rfind("ssm_scan_tiled", 0) == 0) {
        const TiledScan t = tiled_backward(d);
        const int64_t width = 2 * (d.d_state + d.head_dim + 1);
        const int64_t stage = std::min(t.large_stage ? kLargeStageTokens : kSmallStageTokens,
                                       (t.large_stage ? kLargeStage : kSmallStage) / width);
        const int64_t stages_per_chunk = (t.chunk + stage - 1) / stage;
        // the two walks' token loops, the recomputed steps, the sums over rows, states and
        // gdt's shares, the walks over a chunk's earlier stages
        const double per_token = 2.0 + double(stage) + double(t.p_blocks + t.n_blocks) +
                                 double((d.head_dim + 255) / 256) + 32.0 + double(stages_per_chunk);
        return tokens * per_token;
    }
    // ssm_scan.comp: up to four passes over an invocation's 64 owned elements per token, the
    // backward's sums over head_dim and d_state, the reduction and stage loops
    const bool backward = shader.rfind("ssm_scan_backward", 0) == 0;
    return tokens * (backward ? 4.0 * 64 + double(d.d_state + d.head_dim) + 16.0 : 64.0 + 16.0);
}

// How ssm_scan.comp spreads a head's state over its 256 invocations: `lanes` invocations per row
// p, each with 2^slot_shift of the row's states; whether that is more than its registers hold.
struct ScanSplit {
    int64_t lanes;
    uint32_t slot_shift;
    bool in_memory;
};

ScanSplit scan_split(const ScanDims& d) {
    const int64_t rows = std::min<int64_t>(kGroup, int64_t(next_pow2(uint64_t(d.head_dim))));
    const int64_t lanes = int64_t(kGroup) / rows;
    uint32_t slot_shift = 0;  // slots per row: a power of two covering d_state / lanes
    while ((int64_t(1) << slot_shift) * lanes < d.d_state) ++slot_shift;
    constexpr int64_t kMaxOwned = 64, kStage = 4096;  // ssm_scan.comp's registers per invocation, staged floats
    const int64_t owned = (d.head_dim + rows - 1) / rows * (int64_t(1) << slot_shift);
    return {lanes, slot_shift, owned > kMaxOwned || 2 * (d.d_state + d.head_dim) > kStage};
}

namespace vk {

std::string scan_kernel(const ScanDims& d, bool backward) {
    if (!backward && lane_states(d) > 0) return "ssm_scan_rows_" + std::to_string(lane_states(d));
    // The backward tiles pay off from 8 rows per head (Mamba-1's head_dim 1 stays on ssm_scan.comp).
    const TiledScan tiled = tiled_backward(d);
    if (backward && tiled.fits) return tiled.large_stage ? "ssm_scan_tiled_backward_large" : "ssm_scan_tiled_backward";
    return std::string(backward ? "ssm_scan_backward" : "ssm_scan_forward") + (scan_split(d).in_memory ? "_memory" : "");
}

}  // namespace vk

// ssm_scan_tiled.comp where scan_kernel says so, else ssm_scan.comp: one workgroup per (sequence,
// head), and each shader's header says how the state is spread over it.
void ssm_scan_op(const char* pass, const Inputs& in, size_t first, const TensorImpl* g, TensorImpl& out) {
    const ScanDims d = scan_dims(pass, in, first);
    u32(out.numel(), pass);  // the shader indexes the whole output with 32-bit offsets
    const TensorImpl &s = *in[first], &x = *in[first + 1], &dt = *in[first + 2], &a = *in[first + 3],
                     &b = *in[first + 4], &c = *in[first + 5], &ids = *in[first + 6];
    SsmScanPush p{s.address(), x.address(), dt.address(), a.address(), b.address(), c.address(), ids.address(),
                  g ? g->address() : 0, out.address(),
                  u32(d.d_state, pass), u32(d.head_dim, pass), u32(d.n_head, pass), u32(d.n_tok, pass),
                  u32(d.n_seqs, pass), u32(d.n_group, pass), u32(d.a_rows, pass), u32(d.n_rs, pass),
                  u32(d.chunk(), pass), {0, 0}, 0};
    const std::string shader = vk::scan_kernel(d, g != nullptr);
    check_loop_budget(pass, d.n_tok, scan_loop_iterations(d, shader));
    uint64_t n_groups = uint64_t(d.tasks());
    if (shader.rfind("ssm_scan_rows", 0) == 0) {  // workgroups per (sequence, head)
        const int64_t rows = kRowsPerSubgroup * int64_t(kGroup / ctx().limits().subgroup_size);
        n_groups *= uint64_t((d.head_dim + rows - 1) / rows);
    } else if (shader.rfind("ssm_scan_tiled", 0) == 0) {
        const TiledScan tiled = tiled_backward(d);
        p.chunk = u32(tiled.chunk, pass);
        p.split[0] = u32(tiled.n_blocks, pass);
        p.split[1] = u32(tiled.p_blocks, pass);
        p.scratch_stride = u32(d.scratch_per_task(), pass);
    } else {
        const ScanSplit split = scan_split(d);
        p.split[0] = u32(split.lanes, pass);
        p.split[1] = split.slot_shift;
    }
    std::vector<vk::Range> reads{span(s), span(x), span(dt), span(a), span(b), span(c), span(ids)};
    if (g) reads.push_back(span(*g));
    record(shader, p, n_groups, reads, {span(out)});
}

void vk_ssm_scan(const Inputs& in, const OpAttrs&, TensorImpl& out) { ssm_scan_op("ssm_scan", in, 0, nullptr, out); }

void vk_ssm_scan_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    ssm_scan_op("ssm_scan_back", in, 1, in[0].get(), out);
}

namespace {

// ---- matrix-state recurrences (RWKV-6, gated linear attention) ---------------------------------

struct RecurrencePush {
    uint64_t k, v, r, w, u, state, g, o;
    uint32_t S, H, T, n_seqs, n_chunks;
    uint32_t off_bonus, off_state, off_scratch;
    float scale;
};

// One workgroup per (sequence, head) of recurrence.comp. `in` holds (k, v, r-or-q, w, state)
// from position `first`, u is WKV6's bonus (null for GLA), g the upstream gradient (backward).
void recurrence(const char* kind, bool backward, const Inputs& in, size_t first, const TensorImpl* u,
                const TensorImpl* g, float scale, TensorImpl& out) {
    const TensorImpl &k = *in[first], &v = *in[first + 1], &r = *in[first + 2], &w = *in[first + 3],
                     &state = *in[first + 4];
    const RecurrenceDims d = recurrence_sizes(k, state);
    const BackLayout l = back_layout(d, u != nullptr);
    RecurrencePush p{k.address(), v.address(), r.address(), w.address(), u ? u->address() : 0, state.address(),
                     g ? g->address() : 0, out.address()};
    p.S = u32(d.S, kind);
    p.H = u32(d.H, kind);
    p.T = u32(d.T, kind);
    p.n_seqs = u32(d.n_seqs, kind);
    p.n_chunks = u32(d.n_chunks(), kind);
    u32(out.numel(), kind);  // every index of the output fits the shader's 32 bits
    p.off_bonus = backward ? u32(l.bonus, kind) : 0;
    p.off_state = backward ? u32(l.state, kind) : 0;
    p.off_scratch = backward ? u32(l.scratch, kind) : 0;
    p.scale = scale;
    std::vector<vk::Range> reads{span(k), span(v), span(r), span(w), span(state)};
    if (u) reads.push_back(span(*u));
    if (g) reads.push_back(span(*g));
    if (backward) reads.push_back(span(out));  // the stored states are read back
    // S <= 64: at most 4 x 4 state elements per invocation, kept in registers
    const std::string shader = std::string("recurrence_") + kind + (backward ? "_backward" : "_forward") +
                               (d.S <= 64 ? "_registers" : "");
    // recurrence.comp's loops per token, each at its largest trip count: the state update over the
    // owned rows and columns, the sums over 64-wide tiles with their 16 lanes; the backward walks
    // the state twice and sums four quantities
    const double per = double((d.S + 15) / 16), tiles = double((d.S + 63) / 64), lanes = double(std::min<int64_t>(d.S, 16));
    const double forward = 1.0 + per + per * per + tiles * (1.0 + per + per * per + lanes);
    const int64_t tokens = d.T / d.n_seqs;
    check_loop_budget(kind, tokens, kLoopMargin * double(tokens) * (backward ? 4.0 * forward + 8.0 * tiles * lanes : forward));
    record(shader, p, uint64_t(d.n_seqs * d.H), reads, {span(out)});
}

}  // namespace

void vk_rwkv_wkv6(const Inputs& in, const OpAttrs&, TensorImpl& out) {  // (k, v, r, tf, td, state)
    Inputs ordered{in[0], in[1], in[2], in[4], in[5]};
    recurrence("wkv6", false, ordered, 0, in[3].get(), nullptr, 1.0f, out);
}

void vk_rwkv_wkv6_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {  // (g, k, v, r, tf, td, state)
    Inputs ordered{in[1], in[2], in[3], in[5], in[6]};
    recurrence("wkv6", true, ordered, 0, in[4].get(), in[0].get(), 1.0f, out);
}

void vk_gated_linear_attn(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {  // (k, v, q, g, state)
    recurrence("gla", false, in, 0, nullptr, nullptr, float(attrs.floats[0]), out);
}

void vk_gated_linear_attn_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    recurrence("gla", true, in, 1, nullptr, in[0].get(), float(attrs.floats[0]), out);
}

// ---- RWKV-7 ----------------------------------------------------------------------------------

namespace {

// wkv7.comp's loops per token, each at its largest trip count: a row or column sum (its passes,
// each with a part of the row and the parts' sum) and an elementwise pass over the state. The
// forward has two sums and a pass; the backward walks the state twice (a sum and a pass each) and
// then has four sums and two passes.
double wkv7_loop_iterations(int64_t S, int64_t tokens, bool backward) {
    const double ways = double(std::max<int64_t>(1, 256 / S)), lines = 256.0 / ways;
    const double sum = std::ceil(double(S) / lines) * (1.0 + std::ceil(double(S) / ways) + ways);
    const double pass = std::ceil(double(S * S) / 256.0);
    return kLoopMargin * double(tokens) * (backward ? 2.0 + 6.0 * sum + 4.0 * pass : 1.0 + 2.0 * sum + pass);
}

struct Wkv7Push {
    uint64_t r, w, k, v, a, b, state, o;
    uint32_t S, H, T, n_seqs;
};

struct Wkv7BackPush {
    uint64_t r, w, k, v, a, b, state, o, g, scratch;
    uint32_t S, H, T, n_seqs, chunk;
};

}  // namespace

// rwkv_wkv7 and its backward: one workgroup per (sequence, head); shapes checked by the shape rule.
void vk_rwkv_wkv7(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &r = *in[0], &state = *in[6];
    Wkv7Push p{r.address(), in[1]->address(), in[2]->address(), in[3]->address(), in[4]->address(),
               in[5]->address(), state.address(), out.address(), u32(r.ne[0], "rwkv_wkv7"), u32(r.ne[1], "rwkv_wkv7"),
               u32(r.ne[2], "rwkv_wkv7"), u32(state.ne[1], "rwkv_wkv7")};
    u32(out.numel(), "rwkv_wkv7");
    check_loop_budget("rwkv_wkv7", r.ne[2] / state.ne[1], wkv7_loop_iterations(r.ne[0], r.ne[2] / state.ne[1], false));
    std::vector<vk::Range> reads;
    for (const TensorPtr& t : in) reads.push_back(span(*t));
    record("wkv7_forward", p, uint64_t(p.H) * p.n_seqs, reads, {span(out)});
}

void vk_rwkv_wkv7_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &r = *in[1], &state = *in[7];
    const int64_t S = r.ne[0], H = r.ne[1], T = r.ne[2], n_seqs = state.ne[1];
    // the scratch (ops.def): the output's columns after the gradients
    const uint64_t scratch = out.address() + uint64_t(S * H * (6 * T + S * n_seqs)) * sizeof(float);
    Wkv7BackPush p{r.address(), in[2]->address(), in[3]->address(), in[4]->address(), in[5]->address(),
                   in[6]->address(), state.address(), out.address(), g.address(), scratch,
                   u32(S, "rwkv_wkv7_back"), u32(H, "rwkv_wkv7_back"), u32(T, "rwkv_wkv7_back"),
                   u32(n_seqs, "rwkv_wkv7_back"), uint32_t(kRecurrenceChunk)};
    u32(out.numel(), "rwkv_wkv7_back");
    check_loop_budget("rwkv_wkv7_back", T / n_seqs, wkv7_loop_iterations(S, T / n_seqs, true));
    std::vector<vk::Range> reads;
    for (const TensorPtr& t : in) reads.push_back(span(*t));
    record("wkv7_backward", p, uint64_t(H) * n_seqs, reads, {span(out)});
}

}  // namespace rk
